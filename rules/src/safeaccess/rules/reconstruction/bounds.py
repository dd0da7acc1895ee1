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

A released sd/variance adds sum y^2; this check does not use it. The spread concentration rule
(`checks/summary.py`, `spread_dominance`) withholds the case it opens: one record far from the
others holds almost all of sum (y - mean)^2.
"""

from __future__ import annotations

import math

from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import SummaryVariableFacts
from safeaccess.rules.reconstruction._exact import Admissible, ReconstructionError

CHECK = "bounded_reconstruction"


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


def bounded_findings(
    item: str,
    stats: dict[str, float | None],
    vfacts: SummaryVariableFacts,
    decimals: int | None,
    ratio: float,
) -> list[Finding]:
    """Withhold when the released total fixes some record's value to less than `ratio` of the
    range the filter and the declared bounds left it."""
    classes = vfacts.bounds or []
    n = sum(c.count for c in classes)
    if n == 0 or n != vfacts.n:
        return []
    s_low, s_high = _total(stats, n, decimals)
    if math.isinf(s_low) and math.isinf(s_high):
        return []
    lows = [(-math.inf if c.low is None else c.low) for c in classes]
    highs = [(math.inf if c.high is None else c.high) for c in classes]
    counts = [c.count for c in classes]
    for i, (lo, hi) in enumerate(zip(lows, highs, strict=True)):
        post_low = max(lo, s_low - _others(highs, counts, i))
        post_high = min(hi, s_high - _others(lows, counts, i))
        prior = hi - lo
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
                    f"released mean of {item} places one record's value within less than "
                    f"{ratio:.0%} of the range it could otherwise take. Do not filter on the "
                    "summarised variable, or use broader groups.",
                )
            ]
    return []
