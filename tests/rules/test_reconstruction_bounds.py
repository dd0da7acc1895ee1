"""The bound-aware reconstruction check: a released mean with the filter's per-record bounds."""

from __future__ import annotations

from safeaccess.rules.outputs import BoundClass, SummaryVariableFacts
from safeaccess.rules.reconstruction.bounds import bounded_findings

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
