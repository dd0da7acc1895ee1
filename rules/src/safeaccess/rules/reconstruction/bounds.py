"""Reconstruction with the filter's bounds: how tightly a released mean fixes one record.

The records of a group fall into classes whose values the filter and the declared bounds
confine to [l_c, u_c] (`SummaryVariableFacts.bounds`, computed per record by the runner). A
released count and mean (or sum) give the total S up to rounding; then a record of class c lies
in

    [S_low - (sum of the others' upper bounds), S_high - (sum of the others' lower bounds)]

cut to [l_c, u_c]. That is exactly the set the sum allows (every point of it is reached by
moving the other records between their bounds), so the check is sound for the mean. When the
interval is less than `p_ratio` of the width the filter and the declared bounds left the
record (or finite where they left it unbounded), the release tells the record's value and is
withheld: `age == 97 or income between 30000 and 30150` with 16 companions pinned to a band of
150 fixes the one 97-year-old's income to 16 x 150 = 2 400, out of the declared range.

A released sd or variance (with the mean) bounds sum y^2 from above; a record's value t must
then satisfy t^2 + (the least sum of squares the others can have, in their bounds, with the
total) <= that bound. The left side is convex in t (the least sum of squares is found by
water-filling), so the values that fit form an interval, found by a ternary search and two
bisections. This pins two records outside pinned companions (their sum and sum of squares give
both), which the total alone leaves open. It is a relaxation (the others' *largest* sum of
squares is not used), so the range is never narrower than the truth allows; the spread
concentration rule (`checks/summary.py`, `spread_dominance`) covers the one-outsider case from
the other side.
"""

from __future__ import annotations

import math

from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import BoundClass, SummaryVariableFacts, TransformStep
from safeaccess.rules.reconstruction._exact import Admissible, ReconstructionError
from safeaccess.rules.reconstruction.transform import image, preimage_measure

CHECK = "bounded_reconstruction"
# Bisection and ternary-search steps: 2^-64 and (2/3)^64 of a range are below what the
# withhold decision (10 % of the range) can notice, and keep a group under ~20 ms.
_STEPS = 64


def _total(stats: dict[str, float | None], n: int, decimals: int | None) -> tuple[float, float]:
    """(low, high) of the group's exact total that the released mean or sum allow."""
    lows: list[float] = []
    highs: list[float] = []
    for name, factor in (("mean", n), ("sum", 1), ("total", 1)):
        value = stats.get(name)
        if value is None:
            continue
        try:
            adm = Admissible.released(value, decimals)
        except ReconstructionError:
            adm = Admissible.released(value, None)
        lows.append(float(adm.lo * factor))
        highs.append(float(adm.hi * factor))
    if not lows:
        return -math.inf, math.inf
    return max(lows), min(highs)


def _others(ends: list[float], counts: list[int], own: int) -> float:
    """Sum of one end over every record but one of class `own` (infinite if any is)."""
    terms = [e * (c - (i == own)) for i, (e, c) in enumerate(zip(ends, counts, strict=True))]
    terms = [t for t, c in zip(terms, counts, strict=True) if not math.isnan(t) and c]
    return sum(terms) if any(math.isinf(t) for t in terms) else math.fsum(terms)


def _squares_high(stats: dict[str, float | None], n: int, decimals: int | None) -> float:
    """The largest sum of squares sum y^2 a released sd or variance (with the mean) allows;
    inf when neither is released with a mean."""
    mean = stats.get("mean")
    if mean is None or n < 2:
        return math.inf
    best = math.inf
    for name in ("sd", "var"):
        value = stats.get(name)
        if value is None:
            continue
        adm = _admissible(value, decimals)
        var_high = float(adm.hi) ** 2 if name == "sd" else float(adm.hi)
        m = _admissible(mean, decimals)
        mean_sq = max(float(m.lo) ** 2, float(m.hi) ** 2)
        best = min(best, (n - 1) * var_high + n * mean_sq)
    return best


def _admissible(value: float, decimals: int | None) -> Admissible:
    try:
        return Admissible.released(value, decimals)
    except ReconstructionError:
        return Admissible.released(value, None)


def _fill(lam: float, lows: list[float], highs: list[float], counts: list[int]) -> float:
    return math.fsum(
        c * min(max(lam, lo), hi) for lo, hi, c in zip(lows, highs, counts, strict=True)
    )


def _min_squares(lows: list[float], highs: list[float], counts: list[int], s: float) -> float:
    """The least sum of squares of records in their boxes that add up to s (water-filling:
    every record at clamp(lambda, low, high)); inf when s is out of reach."""
    if not any(counts):
        return 0.0 if abs(s) <= 1e-9 * max(1.0, abs(s)) else math.inf
    if s < _others(lows, counts, -1) or s > _others(highs, counts, -1):
        return math.inf
    reach = 1.0 + abs(s) + max((abs(e) for e in (*lows, *highs) if math.isfinite(e)), default=0)
    a, b = -reach, reach
    for _ in range(200):
        if _fill(a, lows, highs, counts) <= s <= _fill(b, lows, highs, counts):
            break
        a, b = 2 * a, 2 * b
    for _ in range(_STEPS):
        mid = (a + b) / 2
        if _fill(mid, lows, highs, counts) < s:
            a = mid
        else:
            b = mid
    lam = (a + b) / 2
    return math.fsum(
        c * min(max(lam, lo), hi) ** 2 for lo, hi, c in zip(lows, highs, counts, strict=True)
    )


def _squares_interval(
    lo: float,
    hi: float,
    others: tuple[list[float], list[float], list[int]],
    total: tuple[float, float],
    q_high: float,
) -> tuple[float, float] | None:
    """Narrow [lo, hi] (finite) to the values t with t^2 + (least sum of squares the others
    can have while the total holds) <= q_high. That function of t is convex, so the values
    form an interval: find its lowest point, then each end by bisection. A relaxation (the
    others' largest sum of squares is not used), so the interval is never too narrow."""
    lows, highs, counts = others
    free = _fill(0.0, lows, highs, counts)  # where the others' least sum of squares is lowest

    def h(t: float) -> float:
        s = min(max(free, total[0] - t), total[1] - t)
        return t * t + _min_squares(lows, highs, counts, s)

    a, b = lo, hi
    for _ in range(_STEPS):
        m1, m2 = a + (b - a) / 3, b - (b - a) / 3
        if h(m1) <= h(m2):
            b = m2
        else:
            a = m1
    best = (a + b) / 2
    if h(best) > q_high * (1 + 1e-12):
        return None  # nothing fits (rounding at the limit of float precision): no claim
    left, right = lo, best
    if h(lo) > q_high:
        for _ in range(_STEPS):
            mid = (left + right) / 2
            left, right = (left, mid) if h(mid) <= q_high else (mid, right)
        left = left
    up_low, up_high = best, hi
    if h(hi) > q_high:
        for _ in range(_STEPS):
            mid = (up_low + up_high) / 2
            up_low, up_high = (mid, up_high) if h(mid) <= q_high else (up_low, mid)
    return left, up_high


def _end(value: float | None, missing: float) -> float:
    return missing if value is None else value


def record_ranges(
    stats: dict[str, float | None], classes: list[BoundClass], decimals: int | None
) -> list[tuple[float, float]]:
    """Per class, the values a record of it can take given the released statistics and every
    record's bounds (infinite ends where nothing bounds it). Never narrower than the truth: a
    record's true value always lies inside its class' range."""
    n = sum(c.count for c in classes)
    s_low, s_high = _total(stats, n, decimals)
    # the others by their part (`BoundClass.part`: narrower, so the ranges found are never
    # wider than an attacker's), each record's own prior by the hull
    lows = [_end(c.low if c.part is None else c.part[0], -math.inf) for c in classes]
    highs = [_end(c.high if c.part is None else c.part[1], math.inf) for c in classes]
    counts = [c.count for c in classes]
    q_high = _squares_high(stats, n, decimals)
    out: list[tuple[float, float]] = []
    for i, own in enumerate(classes):
        lo, hi = _end(own.low, -math.inf), _end(own.high, math.inf)
        post_low, post_high = lo, hi
        if math.isfinite(s_low) or math.isfinite(s_high):
            post_low = max(lo, s_low - _others(highs, counts, i))
            post_high = min(hi, s_high - _others(lows, counts, i))
        if math.isfinite(q_high) and math.isfinite(post_high - post_low):
            # the sd: two records outside pinned companions are fixed by their sum and sum of
            # squares together, which the total alone leaves open
            others = [c - (j == i) for j, c in enumerate(counts)]
            narrowed = _squares_interval(
                post_low, post_high, (lows, highs, others), (s_low, s_high), q_high
            )
            if narrowed is not None:
                post_low, post_high = narrowed
        out.append((post_low, post_high))
    return out


def bounded_findings(
    item: str,
    stats: dict[str, float | None],
    vfacts: SummaryVariableFacts,
    decimals: int | None,
    ratio: float,
) -> list[Finding]:
    """Withhold when the released statistics fix some record's value to less than `ratio` of
    the range the filter and the declared bounds left it.

    A transformed model outcome (`vfacts.transform`, e.g. `log(income) ~ 1`) is released on the
    transformed scale but bounded on the column's: the ranges are found on the transformed
    scale (the bounds carried through the transform) and compared on the column's, where the
    filter put them (`transform.py`). So an infinite end that only the transform creates (log of
    a lower bound 0) is no claim of the release, and a padded set is refused as for the
    untransformed column."""
    classes = vfacts.bounds or []
    if not classes or sum(c.count for c in classes) != vfacts.n:
        return []
    steps = vfacts.transform or []
    priors = [
        (-math.inf if c.low is None else c.low, math.inf if c.high is None else c.high)
        for c in classes
    ]
    if steps:
        ranges = record_ranges(stats, [_carried(steps, c) for c in classes], decimals)
    else:
        ranges = record_ranges(stats, classes, decimals)
    for (lo, hi), (post_low, post_high) in zip(priors, ranges, strict=True):
        prior = hi - lo
        if steps:
            width = preimage_measure(steps, (post_low, post_high), (lo, hi))
        else:
            width = post_high - post_low
        if not math.isfinite(width) or prior == 0:
            continue
        if math.isinf(prior) or width < ratio * prior:
            return [
                Finding(
                    check=CHECK,
                    verdict="withhold",
                    item=item,
                    message=f"with the bounds the filter puts on the other records, the "
                    f"released statistics of {item} place one record's value within less than "
                    f"{ratio:.0%} of the range it could otherwise take. Do not filter on the "
                    "summarised variable, or use broader groups.",
                )
            ]
    return []


def _carried(steps: list[TransformStep], c: BoundClass) -> BoundClass:
    """A class' bounds (and part) on the transformed scale; an infinite end is no bound."""

    def through(low: float | None, high: float | None) -> tuple[float | None, float | None]:
        lo, hi = image(steps, _end(low, -math.inf), _end(high, math.inf))
        return (lo if math.isfinite(lo) else None), (hi if math.isfinite(hi) else None)

    low, high = through(c.low, c.high)
    part = None if c.part is None else through(*c.part)
    return BoundClass(low=low, high=high, count=c.count, part=part)
