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
