"""Summary statistics: means, moments, percentiles, extremes and mode, per group and variable."""

from __future__ import annotations

from typing import Any

import pytest

from safeaccess.rules.engine import DEFAULT_RULESET, check
from safeaccess.rules.outputs import (
    SpreadFacts,
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
    # an even spread (every record 1/n of each moment) unless a test says otherwise
    facts.setdefault(
        "spread", [SpreadFacts(power=r, top=[1.0] * 3, total=float(n)) for r in (2, 3, 4)]
    )
    facts.setdefault("quantile_window", min(10, n))
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


def test_mode_withheld_when_fewer_than_threshold_records_hold_it() -> None:
    # 1 of 25 distinct values: the mode is one record's value (the smallest, ties going low)
    assert _checks(_summary({"mode": 3.0}, n=25, n_distinct=25, mode_share=1 / 25)) == {
        "mode_support"
    }
    # 9 of 30 hold it: one short of the default threshold of 10; 10 of 30 are enough
    assert _checks(_summary({"mode": 3.0}, n=30, n_distinct=5, mode_share=9 / 30)) == {
        "mode_support"
    }
    assert _checks(_summary({"mode": 3.0}, n=30, n_distinct=5, mode_share=10 / 30)) == set()


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


def test_spread_facts_by_hand() -> None:
    from safeaccess.rules.facts import spread_facts

    # values 0, 0, 0, 4: mean 1, deviations 1, 1, 1, 3
    by_power = {s.power: s for s in spread_facts([0.0, 0.0, 0.0, 4.0])}
    assert by_power[2].top == [9.0, 1.0, 1.0] and by_power[2].total == 12.0
    assert by_power[3].top == [27.0, 1.0, 1.0] and by_power[3].total == 30.0
    assert by_power[4].top == [81.0, 1.0, 1.0] and by_power[4].total == 84.0


def _from_values(values: list[float], stats: dict[str, float | None]) -> SummaryOutput:
    from safeaccess.rules.facts import dominance_facts, spread_facts

    return _summary(
        stats,
        n=len(values),
        spread=spread_facts(values),
        **dominance_facts(values),
    )


def test_one_outlier_among_pinned_companions_is_withheld() -> None:
    # attack 5's shape: 16 companions pinned to 30000..30150 by the filter and one target; the
    # target holds about 16/17 = 94 % of the squared deviations, so the sd tells |y - mean|
    values = [30000.0 + 10 * i for i in range(16)] + [80000.0]
    out = _from_values(values, {"count": 17.0, "mean": 0.0, "sd": 0.0})
    found = {f.check for f in check(out, NO_RECON).findings}
    assert "spread_dominance" in found
    assert check(out, NO_RECON).verdict == "withhold"
    # the same group with only a count and mean has no spread statistic to dominate
    only_mean = _from_values(values, {"count": 17.0, "mean": 0.0})
    assert "spread_dominance" not in {f.check for f in check(only_mean, NO_RECON).findings}


def test_single_outlier_at_the_threshold_is_caught() -> None:
    # nine equal companions and one outlier: top share 9/10 = 0.9 >= spread_k
    values = [50.0] * 9 + [1000.0]
    out = _from_values(values, {"count": 10.0, "sd": 0.0})
    assert "spread_dominance" in {f.check for f in check(out, NO_RECON).findings}


def test_ordinary_incomes_spread_is_released() -> None:
    import numpy as np

    values = list(np.random.default_rng(7).lognormal(10.3, 0.6, 300).round())
    out = _from_values(values, {"count": 300.0, "mean": 0.0, "sd": 0.0, "skewness": 0.0})
    assert "spread_dominance" not in {f.check for f in check(out, NO_RECON).findings}


def test_spread_facts_missing_goes_to_review() -> None:
    out = _summary({"sd": 1.0}, n=30, spread=None)
    assert "facts_missing" in _checks(out)


def test_quantiles_need_a_window_of_threshold_records() -> None:
    stats = {"q0.5": 1.0}
    assert "quantile_window" not in _checks(_summary(stats, n=100, quantile_window=10))
    assert "quantile_window" in _checks(_summary(stats, n=100, quantile_window=1))
    assert "quantile_window" in _checks(_summary(stats, n=100, quantile_window=None))


def test_at_most_max_quantiles_per_summary() -> None:
    def qs(k: int) -> dict[str, float | None]:
        return {f"q{j / (k + 1)!r}": 1.0 for j in range(1, k + 1)}

    assert "max_quantiles" not in _checks(_summary(qs(19), n=1000))
    assert "max_quantiles" in _checks(_summary(qs(20), n=1000))
