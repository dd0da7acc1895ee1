"""Summary statistics: means, moments, percentiles, extremes and mode, per group and variable."""

from __future__ import annotations

from typing import Any

import pytest

from safeaccess.rules.engine import DEFAULT_RULESET, check
from safeaccess.rules.outputs import (
    SummaryFacts,
    SummaryGroup,
    SummaryGroupFacts,
    SummaryOutput,
    SummaryVariableFacts,
    VariableSummary,
)

NO_RECON = DEFAULT_RULESET.with_overrides({"reconstruction": False})


def _summary(stats: dict[str, float | None], **facts: Any) -> SummaryOutput:
    n = facts.pop("n")
    vf = SummaryVariableFacts(n=n, n_distinct=facts.pop("n_distinct", n), **facts)
    return SummaryOutput(
        by=["sex"],
        statistics=list(stats),
        groups=[
            SummaryGroup(
                labels=["F"], variables=[VariableSummary(variable="income", n=n, stats=stats)]
            )
        ],
        facts=SummaryFacts(
            groups=[SummaryGroupFacts(labels=["F"], n=n, variables={"income": vf})], n_total=n
        ),
    )


def _checks(out: SummaryOutput) -> set[str]:
    return {f.check for f in check(out, NO_RECON).findings}


SAFE_MEAN = {"top": [30.0, 29.0, 28.0], "total": 600.0, "negative": False}


def test_safe_mean_and_sd_release() -> None:
    # n = 20: threshold ok, 19 df >= 10, largest two 59/600 = 10 %
    out = _summary({"mean": 30.0, "sd": 2.0}, n=20, **SAFE_MEAN)
    d = check(out, NO_RECON)
    assert d.verdict == "release", d.findings
    assert d.findings == []


def test_small_group_withholds_everything_once() -> None:
    d = check(_summary({"mean": 3.0, "sd": 1.0}, n=7, **SAFE_MEAN), NO_RECON)
    assert [(f.check, f.item) for f in d.findings] == [("threshold", "income in sex=F")]


def test_dominated_mean() -> None:
    # 900 + 50 of 1000: 95 % >= 90 % (NK); (1000 - 950) / 900 = 0.056 < 0.1 (p-ratio)
    out = _summary({"mean": 50.0}, n=20, top=[900.0, 50.0, 2.0], total=1000.0, negative=False)
    assert _checks(out) == {"nk_dominance", "p_ratio"}


def test_mean_without_dominance_facts_goes_to_review() -> None:
    d = check(_summary({"mean": 5.0}, n=30), NO_RECON)
    assert d.verdict == "review" and d.findings[0].check == "facts_missing"


def test_sd_needs_ten_degrees_of_freedom() -> None:
    # n = 10 -> 9 df < 10; n = 11 -> 10 df
    assert _checks(_summary({"sd": 1.0}, n=10)) == {"dof"}
    assert _checks(_summary({"sd": 1.0}, n=11)) == set()


def test_zero_variance_reveals_every_value() -> None:
    out = _summary({"sd": 0.0}, n=30, n_distinct=1, variance_zero=True)
    assert _checks(out) == {"zero_variance"}


@pytest.mark.parametrize(
    ("stat", "n", "fires"),
    [
        ("median", 19, True),  # 9.5 records on each side < 10
        ("median", 20, False),  # 10 on each side (IAB's median N >= 20 as well)
        ("q0.25", 39, True),  # 9.75 below the lower quartile
        ("q0.25", 40, False),
        ("q0.9", 100, False),  # 10 above
        ("q0.9", 99, True),
        ("iqr", 40, False),
    ],
)
def test_each_percentile_rests_on_ten_records(stat: str, n: int, fires: bool) -> None:
    assert ("quantile_support" in _checks(_summary({stat: 1.0}, n=n))) is fires


def test_raw_extremes_are_withheld_unless_top_coded() -> None:
    assert _checks(_summary({"max": 99.0}, n=50, n_at_max=1)) == {"extremes"}
    assert _checks(_summary({"max": 99.0}, n=50)) == {"extremes"}  # unknown: treat as raw
    # 12 records sit at the top-coded value 99: no single person's value
    assert _checks(_summary({"max": 99.0, "min": 0.0}, n=50, n_at_max=12, n_at_min=15)) == set()
    rs = NO_RECON.with_overrides({"extremes": "review"})
    assert check(_summary({"min": 1.0}, n=50, n_at_min=1), rs).verdict == "review"


def test_mode_withheld_when_all_values_share_it() -> None:
    assert _checks(_summary({"mode": 3.0}, n=25, n_distinct=1, mode_share=1.0)) == {"mode"}
    assert _checks(_summary({"mode": 3.0}, n=25, n_distinct=4, mode_share=0.6)) == set()


def test_missing_facts_for_a_variable_go_to_review() -> None:
    out = _summary({"sd": 1.0}, n=30)
    out = out.model_copy(update={"facts": SummaryFacts(groups=[], n_total=30)})
    d = check(out, NO_RECON)
    assert d.verdict == "review" and d.findings[0].check == "facts_missing"


def test_dominance_facts_by_hand() -> None:
    from safeaccess.rules.facts import dominance_facts
    from safeaccess.rules.outputs import SummaryVariableFacts

    # values 5, 1, 9, 9, nan, -2: top 9, 9, 5; total 22; two at the max; one missing; a negative
    f = dominance_facts([5, 1, 9, 9, None, -2])
    assert f == {
        "missing": 1,
        "negative": True,
        "total": 22.0,
        "n_at_min": 1,
        "n_at_max": 2,
        "top": [9.0, 9.0, 5.0],
    }
    # per contributor unit: a = 5 + 9 = 14, b = 1 + 9 = 10, c = -2
    g = dominance_facts([5, 1, 9, 9, -2], contributor=["a", "b", "a", "b", "c"])
    assert g["top"] == [14.0, 10.0, -2.0] and g["contributors"] == 3
    SummaryVariableFacts(n=5, n_distinct=4, **g)  # the keys are fields of the facts model
