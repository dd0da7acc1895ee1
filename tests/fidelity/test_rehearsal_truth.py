"""The rehearsal on the mock runs the real step's code: a 0/1 event column declared categorical
is numeric whether it is stored as int64 (registered data), as Python objects (the mock) or as
pandas categories; synthetic data is not predicted from a mock (its release is decided by noise
and a check against the real records), and no internal type name reaches the researcher; the
card never puts "passed every check" beside a withhold."""

from __future__ import annotations

from typing import Any

import pandas as pd
from fidelity_data import make_frame, metadata

from safeaccess.client.analyses import Survival, parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.notebook import rehearsal_html
from safeaccess.client.rehearsal import Rehearsal
from safeaccess.rules.ruleset import DEFAULT_RULESET, RuleSet
from safeaccess.sandbox.mock.data import mock_frame
from safeaccess.sandbox.mock.rehearse_step import rehearse_step
from safeaccess.sandbox.runner import execute
from safeaccess.server.schemas import RehearsalStep

META = metadata("survey")


def _step(
    index: int, body: dict[str, Any], meta: DatasetMetadata, mock: pd.DataFrame, rs: RuleSet
) -> RehearsalStep:
    """The centre's rehearsal of one analysis (the step code both rehearsals share)."""
    return RehearsalStep.model_validate(rehearse_step(index, parse_analysis(body), meta, mock, rs))


def test_a_categorical_event_column_is_numeric_however_it_is_stored() -> None:
    frame = make_frame(600, seed=3).drop(columns=["person_id"])
    analysis = Survival(time="days", event="died", by=["sex"], interval=200)
    reference = execute(analysis, frame, META).model_dump(mode="json")
    for stored in (frame["died"].astype(object), pd.Categorical(frame["died"], categories=[0, 1])):
        copy = frame.assign(died=stored)
        assert execute(analysis, copy, META).model_dump(mode="json") == reference


def test_survival_on_the_mock_is_not_refused_as_not_numeric() -> None:
    mock = mock_frame(META, 3000)
    body = Survival(time="days", event="died", interval=300).model_dump(mode="json")
    step = _step(0, body, META, mock, DEFAULT_RULESET)
    assert step.mock_verdict != "failed" and "not_numeric" not in (step.note or "")


def test_synthetic_data_is_not_predicted_from_the_mock() -> None:
    mock = mock_frame(META, 3000)
    body = {
        "kind": "synthetic_data",
        "columns": ["region", "sex", "employed"],
        "epsilon": 1.0,
        "delta": 1e-7,
    }
    step = _step(0, body, META, mock, DEFAULT_RULESET)
    assert step.mock_verdict == "not_rehearsed"
    assert "Output" not in (step.note or "") and "disclosure check" in (step.note or "")


def test_the_card_never_says_passed_beside_a_withhold() -> None:
    report = Rehearsal.from_json(
        {
            "dataset": "survey",
            "version": 1,
            "rows": 3000,
            "mock_rows": 3000,
            "ruleset": "default@1",
            "notes": [],
            "disclaimer": "a mock",
            "steps": [
                {
                    "index": 0,
                    "kind": "regression",
                    "mock_verdict": "withhold",
                    "checks": [],
                    "refused": [],
                    "note": "on the mock the computation failed",
                },
                {
                    "index": 1,
                    "kind": "summary",
                    "mock_verdict": "release",
                    "checks": [],
                    "refused": [],
                },
            ],
        }
    )
    html = rehearsal_html(report)
    withheld, released = html.split("<tr><td>2</td>")  # steps are shown 1-based
    assert "passed every check" not in withheld and "computation failed" in withheld
    assert "passed every check" in released


def test_a_group_small_only_in_combination_is_named_not_predicted() -> None:
    """Which cells of two columns are small is not published (docs/server.md says why), so the
    mock cannot reproduce them: a table released on the mock says that such a cell would
    withhold the real table, and suppression (asked for) is what the real run does with it."""
    from safeaccess.client.metadata import Column, ColumnProfile

    half = ColumnProfile(levels=[50, 50])
    meta = DatasetMetadata(
        name="joint",
        description="two 50/50 columns whose combination has two small cells",
        columns=[
            Column(name="a", type="categorical", levels=["x", "y"], profile=half),
            Column(name="b", type="categorical", levels=["u", "v"], profile=half),
        ],
    )
    a = ["x"] * 3 + ["x"] * 97 + ["y"] * 97 + ["y"] * 3
    b = ["u"] * 3 + ["v"] * 97 + ["u"] * 97 + ["v"] * 3
    real = pd.DataFrame({"a": a, "b": b})
    mock = mock_frame(meta, len(real))
    rs = DEFAULT_RULESET
    body = {"kind": "frequency_table", "rows": ["a"], "cols": ["b"]}
    rehearsed = _step(1, body, meta, mock, rs)
    # the same step code on the real records is what the server runs
    assert _step(1, body, meta, real, rs).mock_verdict == "withhold"
    assert rehearsed.mock_verdict == "release"
    assert rehearsed.note is not None and "a, b each on its own" in rehearsed.note
    assert "withholds the table" in rehearsed.note and "suppress=True" in rehearsed.note
    suppressed = {**body, "mitigations": {"suppress": True}}
    assert _step(1, suppressed, meta, real, rs).mock_verdict == "release"
    note = _step(1, suppressed, meta, mock, rs).note
    assert note is not None and "suppressed, as you asked" in note
    # one column alone has no joint cell to warn about
    assert _step(1, {"kind": "frequency_table", "rows": ["a"]}, meta, mock, rs).note is None
