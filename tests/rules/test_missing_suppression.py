"""Missing counts are checked like cells: small ones suppressed (and enough others that their
sum is no small difference), their records taken out of the auditor's query sets."""

from __future__ import annotations

import numpy as np
import pytest

from safeaccess.rules.engine import check
from safeaccess.rules.missing import missing_findings, suppress_small_missing
from safeaccess.rules.outputs import (
    CorrelationFacts,
    CorrelationOutput,
    MissingCount,
    QuerySet,
    extra_query_sets_of,
    missing_label,
)
from safeaccess.rules.ruleset import DEFAULT_RULESET


def _output(counts: dict[str, int]) -> CorrelationOutput:
    labels = list(counts)
    cells = np.concatenate([np.full(c, i) for i, c in enumerate(counts.values())] + [[-1] * 5])
    names = [missing_label(["income"], [g]) for g in labels]
    return CorrelationOutput(
        method="pearson",
        variables=["income", "age"],
        matrix=[[1.0, 0.5], [0.5, 1.0]],
        n=100,
        missing=[MissingCount(variables=["income"], group=[g], count=c) for g, c in counts.items()],
        facts=CorrelationFacts(
            n=100,
            binary=[],
            query_set=QuerySet.from_array(["complete records"], np.zeros(len(cells), dtype=int)),
            missing_query_sets=[QuerySet.from_array(names, cells)],
        ),
    )


def test_a_small_count_and_the_smallest_shown_one_are_suppressed() -> None:
    raw = _output({"a": 3, "b": 4, "c": 12, "d": 30, "e": 0})
    # a small count shown is a withhold, like a small cell
    assert check(raw).verdict == "withhold"
    assert {f.item for f in missing_findings(raw, DEFAULT_RULESET)} == {
        "missing income | a",
        "missing income | b",
    }
    out = suppress_small_missing(raw, DEFAULT_RULESET)
    shown = {m.group[0]: (m.count, m.suppressed) for m in out.missing}  # type: ignore[union-attr]
    # 3 + 4 < 10: the smallest shown count (12) goes too; 0 and 30 stay
    assert shown == {
        "a": (None, True),
        "b": (None, True),
        "c": (None, True),
        "d": (30, False),
        "e": (0, False),
    }
    (qs,) = [q for q in extra_query_sets_of(out) if q.labels[0].startswith("missing")]
    kept = qs.to_array()
    assert set(kept[kept >= 0].tolist()) == {3}  # only d's records are admitted
    found = missing_findings(out, DEFAULT_RULESET)
    assert [(f.check, f.verdict) for f in found] == [("missing_suppressed", "release")]
    # the input is left as it was
    assert [m.count for m in raw.missing] == [3, 4, 12, 30, 0]


def test_counts_at_or_over_the_threshold_are_left_alone() -> None:
    raw = _output({"a": 10, "b": 0, "c": 25})
    assert suppress_small_missing(raw, DEFAULT_RULESET) is raw
    assert missing_findings(raw, DEFAULT_RULESET) == []


def test_a_summary_n_is_suppressed_with_its_missing_count() -> None:
    # issue 41: the group's size less n is the missing count. Groups a (3 missing incomes:
    # suppressed), b (12: suppressed too, as the smallest shown, so that the suppressed hold
    # 10) and c (15: shown); age is never missing. Expected sets from pandas, not from the
    # code under test.
    import pandas as pd

    from safeaccess.client.analyses import parse_analysis
    from safeaccess.client.metadata import DatasetMetadata
    from safeaccess.rules.outputs import SummaryOutput
    from safeaccess.sandbox.runner import execute

    rng = np.random.default_rng(3)
    group = np.repeat(["a", "b", "c"], 40)
    income = rng.uniform(10, 20, group.size)
    income[[0, 1, 2]] = np.nan
    income[40:52] = np.nan
    income[80:95] = np.nan
    frame = pd.DataFrame({"g": group, "income": income, "age": rng.integers(20, 60, group.size)})
    meta = DatasetMetadata.model_validate(
        {
            "name": "m",
            "columns": [
                {"name": "g", "type": "categorical", "levels": ["a", "b", "c"]},
                {"name": "income", "type": "continuous"},
                {"name": "age", "type": "integer"},
            ],
        }
    )
    body = {"kind": "summary", "variables": ["income", "age"], "by": ["g"]}
    raw = execute(parse_analysis({**body, "statistics": ["count", "mean"]}), frame, meta)
    assert isinstance(raw, SummaryOutput)
    out = suppress_small_missing(raw, DEFAULT_RULESET)
    assert isinstance(out, SummaryOutput)
    shown = {
        (str(g.labels[0]), v.variable): (v.n, v.n_suppressed, v.stats["count"])
        for g in out.groups
        for v in g.variables
    }
    present = frame.groupby("g")["income"].count()
    assert shown[("a", "income")] == (None, True, None)
    assert shown[("b", "income")] == (None, True, None)
    assert shown[("c", "income")] == (int(present["c"]), False, float(present["c"]))
    assert all(shown[(g, "age")] == (40, False, 40.0) for g in "abc")
    means = {str(g.labels[0]): g.variables[0].stats["mean"] for g in out.groups}
    assert means["a"] == pytest.approx(frame.loc[frame.g == "a", "income"].mean())  # shown
    # income's set: the whole of a and b (their n is hidden), c's present records
    assert out.facts.query_set is not None
    cells = out.facts.query_set.to_array()
    expected = np.where(frame.g == "c", np.where(frame.income.isna(), -1, 2), 0)
    expected[frame.g == "b"] = 1
    assert cells.tolist() == expected.tolist()
    (age,) = out.facts.extra_query_sets
    assert age.to_array().tolist() == frame.g.map({"a": 0, "b": 1, "c": 2}).tolist()


def test_a_table_of_means_is_admitted_over_whole_cells_where_the_missing_count_is_hidden() -> None:
    import pandas as pd

    from safeaccess.client.analyses import parse_analysis
    from safeaccess.client.metadata import DatasetMetadata
    from safeaccess.rules.outputs import TableOutput
    from safeaccess.sandbox.runner import execute

    rng = np.random.default_rng(4)
    group = np.repeat(["a", "b"], 40)
    income = rng.uniform(10, 20, group.size)
    income[[0, 1, 2]] = np.nan  # a: 3 missing, suppressed with b's 15
    income[40:55] = np.nan
    frame = pd.DataFrame({"g": group, "income": income})
    meta = DatasetMetadata.model_validate(
        {
            "name": "m",
            "columns": [
                {"name": "g", "type": "categorical", "levels": ["a", "b"]},
                {"name": "income", "type": "continuous"},
            ],
        }
    )
    present = np.where(frame.income.isna(), -1, frame.g.map({"a": 0, "b": 1}))
    whole = frame.g.map({"a": 0, "b": 1}).to_numpy()
    for agg, expected in (("mean", whole), ("sum", present)):
        body = {"kind": "magnitude_table", "value": "income", "rows": ["g"], "agg": agg}
        out = suppress_small_missing(execute(parse_analysis(body), frame, meta), DEFAULT_RULESET)
        assert isinstance(out, TableOutput) and out.facts.query_set is not None
        assert out.facts.query_set.to_array().tolist() == expected.tolist(), agg
