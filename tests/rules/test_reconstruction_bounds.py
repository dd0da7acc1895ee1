"""The bound-aware reconstruction check: a released mean with the filter's per-record bounds."""

from __future__ import annotations

import math
import random

from safeaccess.rules.outputs import BoundClass, SummaryVariableFacts
from safeaccess.rules.reconstruction.bounds import bounded_findings, record_ranges

BAND = BoundClass(low=30000.0, high=30150.0, count=16)


def _facts(*classes: BoundClass) -> SummaryVariableFacts:
    n = sum(c.count for c in classes)
    return SummaryVariableFacts(n=n, n_distinct=n, bounds=list(classes))


def _checks(stats: dict[str, float | None], *classes: BoundClass, decimals: int | None = None):
    found = bounded_findings("income", stats, _facts(*classes), decimals, 0.1)
    return [f.check for f in found]


def test_one_unbounded_record_among_pinned_companions_is_fixed() -> None:
    # attack 5: 16 companions in 30000..30150 and one record bounded only by 0..1e6. A mean of
    # (81234 + 16 * 30075) / 17 fixes her income to [81234 - 1200, 81234 + 1200]: 0.24 % of 1e6
    mean = (81234 + 16 * 30075) / 17
    target = BoundClass(low=0.0, high=1e6, count=1)
    assert _checks({"count": 17.0, "mean": mean}, target, BAND) == ["bounded_reconstruction"]
    # rounded to whole units the interval only grows by 17 * 0.5 on each side: still fixed
    assert _checks({"mean": float(round(mean))}, target, BAND, decimals=0) == [
        "bounded_reconstruction"
    ]
    # without declared bounds the record had no range at all, and now has a finite one
    free = BoundClass(low=None, high=None, count=1)
    assert _checks({"mean": mean}, free, BAND) == ["bounded_reconstruction"]


def test_two_unbounded_records_hide_each_other() -> None:
    # two records share 0..1e6: either one can take any value the other compensates for
    mean = (81234 + 50000 + 16 * 30075) / 18
    two = BoundClass(low=0.0, high=1e6, count=2)
    assert _checks({"mean": mean}, two, BAND) == []


def test_a_band_alone_says_nothing_new() -> None:
    # every record in the band: the mean moves each within its own band only
    assert _checks({"mean": 30075.0}, BAND) == []
    # exact filter value: already pinned by the filter, not by the release
    exact = BoundClass(low=30000.0, high=30000.0, count=12)
    assert _checks({"mean": 30000.0}, exact) == []


def test_everyone_at_the_top_of_their_bound_is_fixed() -> None:
    # all 16 at 30150: the mean 30150 leaves each record no room
    assert _checks({"mean": 30150.0}, BAND) == ["bounded_reconstruction"]


def test_no_mean_no_finding() -> None:
    target = BoundClass(low=0.0, high=1e6, count=1)
    assert _checks({"count": 17.0, "sd": 12000.0}, target, BAND) == []


def _sd(values: list[float]) -> float:
    n = len(values)
    m = sum(values) / n
    return math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))


def test_two_outsiders_are_fixed_by_the_sd_though_not_by_the_mean() -> None:
    # 10 companions in the band and two records bounded only by 0..1e6 (80 000 and 60 000): the
    # total and the sum of squares give a + b and a^2 + b^2, so both follow (up to which is which)
    companions = [30000.0 + 15 * i for i in range(10)]
    values = [*companions, 80000.0, 60000.0]
    mean = sum(values) / len(values)
    two = BoundClass(low=0.0, high=1e6, count=2)
    band = BoundClass(low=30000.0, high=30150.0, count=10)
    assert _checks({"mean": mean}, two, band) == []
    assert _checks({"mean": mean, "sd": _sd(values)}, two, band) == ["bounded_reconstruction"]
    # both true values lie in the range the check computes, which is about [60 000, 80 000]
    (low, high), _ = record_ranges({"mean": mean, "sd": _sd(values)}, [two, band], None)
    assert 55_000 < low <= 60_000 and 80_000 <= high < 85_000


def test_true_values_always_lie_in_their_range() -> None:
    # soundness on random instances: the truth is one consistent sample, so every record's
    # value must be inside its class' computed range (else the check claims too much)
    rng = random.Random(20)
    for _ in range(300):
        classes: list[BoundClass] = []
        values: list[tuple[int, float]] = []
        for k in range(rng.randint(1, 3)):
            lo = rng.choice([None, rng.uniform(-50, 50)])
            hi = rng.choice([None, (lo or 0.0) + rng.uniform(0, 100)])
            count = rng.randint(1, 6)
            classes.append(BoundClass(low=lo, high=hi, count=count))
            a = lo if lo is not None else (hi if hi is not None else 0.0) - 200
            b = hi if hi is not None else a + 300
            values += [(k, rng.uniform(a, b)) for _ in range(count)]
        ys = [v for _, v in values]
        if len(ys) < 2:
            continue
        decimals = rng.choice([None, 2])
        mean = sum(ys) / len(ys)
        stats: dict[str, float | None] = {
            "mean": round(mean, decimals) if decimals is not None else mean,
            "sd": round(_sd(ys), decimals) if decimals is not None else _sd(ys),
        }
        ranges = record_ranges(stats, classes, decimals)
        for k, v in values:
            low, high = ranges[k]
            assert low - 1e-6 <= v <= high + 1e-6, (classes, values, ranges)


def test_ordinary_spread_among_bounded_records_is_released() -> None:
    # 300 records, all in 0..1e6 and 40 of them in a band: nothing is narrowed by a tenth
    rng = random.Random(4)
    free = [rng.uniform(20_000, 90_000) for _ in range(260)]
    band = [rng.uniform(30_000, 30_150) for _ in range(40)]
    values = free + band
    stats = {"mean": sum(values) / 300, "sd": _sd(values)}
    classes = [
        BoundClass(low=0.0, high=1e6, count=260),
        BoundClass(low=30000.0, high=30150.0, count=40),
    ]
    assert _checks(stats, *classes) == []
