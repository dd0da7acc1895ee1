"""Missing counts are checked like cells: small ones suppressed (and enough others that their
sum is no small difference), their records taken out of the auditor's query sets."""

from __future__ import annotations

import numpy as np

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
