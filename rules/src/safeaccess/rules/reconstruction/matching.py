"""Which samples are consistent with released statistics, counted without enumerating them.

The unknown sample is a vector of counts c_v >= 0 over the scale values v, summing to n. A
released mean pins sum(v c_v) to a few integers S; a released SD (or variance) then pins
sum(v^2 c_v) to a short interval of integers Q for each S; released medians, quantiles, minima
and maxima pin order statistics, i.e. bounds on the cumulative counts F(v) = sum_{u<=v} c_u.

A memoised dynamic programme walks the values from the lowest up with state
(value, items left, sum left, sum of squares left), pruning every state whose remaining items
cannot reach the remaining sums: the sum must lie between r*min and r*max of the values left, and
the sum of squares between the most concentrated (values at floor/ceil of the mean) and the most
spread (all at the two ends) arrangement. With both sums known, the last four values are solved
in closed form (three equations leave one free count, whose admissible values form an interval).
The same walk returns, for each value, the least and greatest count it takes over all consistent
samples. Counts are exact Python integers. A mean and SD alone are first offered to the faster
shell (`shells.py`) and pivot (`pivot.py`) methods.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import accumulate, combinations_with_replacement, pairwise

from safeaccess.rules.reconstruction._exact import (
    Admissible,
    Number,
    QuantileWeights,
    ReconstructionError,
)
from safeaccess.rules.reconstruction.pivot import count_targets
from safeaccess.rules.reconstruction.shells import count_targets_shells

DEFAULT_MAX_STEPS = 5_000_000
MAX_SCENARIOS = 20_000


class BudgetExceeded(ReconstructionError):
    """The question could not be answered within the allowed DP steps or time."""


@dataclass(frozen=True)
class OrderConstraint:
    """A released median, quantile, minimum or maximum: sum(w * x_(i)) lies in `admissible`."""

    name: str
    weights: QuantileWeights
    admissible: Admissible


@dataclass(frozen=True)
class SampleConstraints:
    """Everything released about one sample of n values on the integer scale low..high."""

    low: int
    high: int
    n: int
    means: tuple[Admissible, ...] = ()
    sds: tuple[Admissible, ...] = ()
    variances: tuple[Admissible, ...] = ()
    order: tuple[OrderConstraint, ...] = ()

    def __post_init__(self) -> None:
        if self.high < self.low:
            raise ReconstructionError(f"scale ({self.low}, {self.high}) is empty")
        if self.n < 1:
            raise ReconstructionError(f"the sample needs at least one value, got n={self.n}")
        if self.n < 2 and (self.sds or self.variances):
            raise ReconstructionError("an SD or variance needs n >= 2")
        for oc in self.order:
            if any(not 1 <= i <= self.n for i, _ in oc.weights):
                raise ReconstructionError(f"{oc.name} refers to an order statistic beyond n")

    def merged(self, other: SampleConstraints) -> SampleConstraints:
        """Both sets of statistics, released about the same sample."""
        if (self.low, self.high, self.n) != (other.low, other.high, other.n):
            raise ReconstructionError("statistics about different samples cannot be combined")
        return SampleConstraints(
            self.low,
            self.high,
            self.n,
            self.means + other.means,
            self.sds + other.sds,
            self.variances + other.variances,
            self.order + other.order,
        )

    def is_empty(self) -> bool:
        """True when nothing released constrains the sample."""
        return not (self.means or self.sds or self.variances or self.order)

    def admits(self, counts: Mapping[int, int]) -> bool:
        """Would a sample with these value counts produce the released statistics?"""
        if any(c < 0 or (c > 0 and not self.low <= v <= self.high) for v, c in counts.items()):
            return False
        return self.admits_vector([counts.get(v, 0) for v in range(self.low, self.high + 1)])

    def admits_vector(self, counts: Sequence[int]) -> bool:
        """`admits` for counts listed by value, lowest first (all >= 0)."""
        n = self.n
        if sum(counts) != n:
            return False
        values = range(self.low, self.high + 1)
        if self.means or self.sds or self.variances:
            s = sum(v * c for v, c in zip(values, counts, strict=True))
            if not all(a.contains(Fraction(s, n)) for a in self.means):
                return False
            if self.sds or self.variances:
                q = sum(v * v * c for v, c in zip(values, counts, strict=True))
                var = Fraction(n * q - s * s, n * (n - 1))
                if not all(a.contains_sqrt(var) for a in self.sds):
                    return False
                if not all(a.contains(var) for a in self.variances):
                    return False
        if self.order:
            cumulative = list(accumulate(counts))
            for oc in self.order:
                stat = sum(
                    (w * (self.low + bisect_left(cumulative, i)) for i, w in oc.weights),
                    Fraction(0),
                )
                if not oc.admissible.contains(stat):
                    return False
        return True


@dataclass(frozen=True)
class MatchResult:
    """How many samples fit, and the least and greatest count of each value among them."""

    count: int
    bounds: dict[int, tuple[int, int]] = field(default_factory=dict)

    def pinned(self) -> dict[int, int]:
        """Values whose count is the same in every consistent sample."""
        return {v: lo for v, (lo, hi) in self.bounds.items() if lo == hi}


@dataclass
class _Frame:
    """Bounds on cumulative counts F(v) and on counts c_v, by shifted value index."""

    f_lo: list[int]
    f_hi: list[int]
    c_lo: list[int]
    c_hi: list[int]
    memo: dict[tuple[int, int, int, int], object] = field(default_factory=dict)


_Node = tuple[int, tuple[int, ...], tuple[int, ...]]


class _Solver:
    def __init__(
        self,
        cons: SampleConstraints,
        max_steps: int | None,
        time_budget: float | None,
        count_bounds: Mapping[int, tuple[int, int]] | None = None,
        hint: Mapping[int, int] | None = None,
    ) -> None:
        self.cons = cons
        # Preferred count of each shifted value: searches try counts nearest to it first.
        self.hint = [(hint or {}).get(v, 0) for v in range(cons.low, cons.high + 1)]
        self.k = cons.high - cons.low + 1
        self.n = cons.n
        self.track_t = bool(cons.means or cons.sds or cons.variances)
        self.track_u = bool(cons.sds or cons.variances)
        self.max_steps = DEFAULT_MAX_STEPS if max_steps is None else max_steps
        self.deadline = None if time_budget is None else time.monotonic() + time_budget
        self.steps = 0
        self.targets = self._targets()
        self.frames = self._frames(count_bounds or {})

    # -- setting up -------------------------------------------------------------------------

    def _targets(self) -> list[tuple[int, int]]:
        """Admissible (sum, sum of squares) pairs, in values shifted to start at 0."""
        c, n, low = self.cons, self.n, self.cons.low
        if not self.track_t:
            return [(0, 0)]
        s_lo, s_hi = n * c.low, n * c.high
        if c.means:
            s_lo = max(s_lo, math.ceil(n * max(a.lo for a in c.means)))
            s_hi = min(s_hi, math.floor(n * min(a.hi for a in c.means)))
        v_lo, v_hi = Fraction(0), None
        for a in c.sds:
            if a.hi < 0:
                return []
            v_lo = max(v_lo, max(a.lo, Fraction(0)) ** 2)
            v_hi = a.hi**2 if v_hi is None else min(v_hi, a.hi**2)
        for a in c.variances:
            v_lo = max(v_lo, a.lo)
            v_hi = a.hi if v_hi is None else min(v_hi, a.hi)
        out: list[tuple[int, int]] = []
        for s in range(s_lo, s_hi + 1):
            if not all(a.contains(Fraction(s, n)) for a in c.means):
                continue
            t = s - n * low
            if not self.track_u:
                out.append((t, 0))
                continue
            assert v_hi is not None
            q_lo = math.ceil((n * (n - 1) * v_lo + s * s) / n)
            q_hi = math.floor((n * (n - 1) * v_hi + s * s) / n)
            for q in range(q_lo, q_hi + 1):
                var = Fraction(n * q - s * s, n * (n - 1))
                if all(a.contains_sqrt(var) for a in c.sds) and all(
                    a.contains(var) for a in c.variances
                ):
                    out.append((t, q - 2 * low * s + n * low * low))
        return out

    def _frames(self, count_bounds: Mapping[int, tuple[int, int]]) -> list[_Frame]:
        k, n, low = self.k, self.n, self.cons.low
        c_lo, c_hi = [0] * k, [n] * k
        for v, (lo, hi) in count_bounds.items():
            if not self.cons.low <= v <= self.cons.high:
                raise ReconstructionError(f"value {v} is not on the scale")
            c_lo[v - low], c_hi[v - low] = max(0, lo), min(n, hi)
        frames: list[_Frame] = []
        for assignment in self._scenarios():
            f_lo, f_hi = [0] * k, [n] * k
            f_lo[k - 1] = n
            for pos, v in assignment.items():
                if v >= 1:
                    f_hi[v - 1] = min(f_hi[v - 1], pos - 1)
                f_lo[v] = max(f_lo[v], pos)
            for v in range(1, k):
                f_lo[v] = max(f_lo[v], f_lo[v - 1])
            for v in range(k - 2, -1, -1):
                f_hi[v] = min(f_hi[v], f_hi[v + 1])
            if all(lo <= hi for lo, hi in zip(f_lo, f_hi, strict=True)):
                frames.append(_Frame(f_lo, f_hi, list(c_lo), list(c_hi)))
        return frames

    def _scenarios(self) -> list[dict[int, int]]:
        """All assignments of (shifted) values to the constrained order statistics.

        Each released order statistic admits a few value tuples at its positions; the
        scenarios are their consistent combinations. Distinct scenarios differ at some
        position, so they describe disjoint sets of samples and their counts add up.
        """
        low, k = self.cons.low, self.k
        per_constraint: list[list[dict[int, int]]] = []
        for oc in self.cons.order:
            positions = [i for i, _ in oc.weights]
            options = []
            for values in combinations_with_replacement(range(k), len(positions)):
                stat = sum(
                    (w * (v + low) for (_, w), v in zip(oc.weights, values, strict=True)),
                    Fraction(0),
                )
                if oc.admissible.contains(stat):
                    options.append(dict(zip(positions, values, strict=True)))
            per_constraint.append(options)
        scenarios: list[dict[int, int]] = [{}]
        for options in sorted(per_constraint, key=len):
            nxt = []
            for base in scenarios:
                for opt in options:
                    if all(base.get(p, v) == v for p, v in opt.items()):
                        nxt.append({**base, **opt})
                        if len(nxt) > MAX_SCENARIOS:
                            raise BudgetExceeded(
                                "the released quantiles admit too many combinations of order "
                                "statistics to check exactly"
                            )
            scenarios = nxt
        return [s for s in scenarios if _monotone(s)]

    # -- the walk ---------------------------------------------------------------------------

    def _tick(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise BudgetExceeded(f"more than {self.max_steps} steps needed")
        if (
            self.deadline is not None
            and self.steps % 2048 == 0
            and time.monotonic() > self.deadline
        ):
            raise BudgetExceeded("time budget exhausted")

    def _viable(self, a: int, r: int, t: int, u: int) -> bool:
        b = self.k - 1
        if self.track_t and not r * a <= t <= r * b:
            return False
        if self.track_u and r > 0:
            if u > (a + b) * t - r * a * b:
                return False
            f, e = divmod(t, r)
            if u < r * f * f + e * (2 * f + 1):
                return False
        return True

    def _children(
        self, fr: _Frame, a: int, r: int, t: int, u: int
    ) -> Iterator[tuple[int, int, int, int]]:
        """Counts c of value a that leave a viable state for the values above a."""
        n, b = self.n, self.k - 1
        done = n - r
        lo = max(0, fr.f_lo[a] - done, fr.c_lo[a])
        hi = min(r, fr.f_hi[a] - done, fr.c_hi[a])
        wt = a if self.track_t else 0
        wu = a * a if self.track_u else 0
        if self.track_t:
            lo = max(lo, r * (a + 1) - t)
            hi = min(hi, (r * b - t) // (b - a))
        if wu:
            hi = min(hi, u // wu)
        for c in range(lo, hi + 1):
            self._tick()
            r2, t2, u2 = r - c, t - wt * c, u - wu * c
            if self._viable(a + 1, r2, t2, u2):
                yield c, r2, t2, u2

    def _last(self, fr: _Frame, a: int, r: int, t: int, u: int) -> tuple[int, ...] | None:
        """Counts of the values a.. (the last one or three) when they are forced, else None."""
        b = self.k - 1
        done = self.n - r
        if a == b:
            ok = (
                fr.c_lo[b] <= r <= fr.c_hi[b]
                and (not self.track_t or t == r * b)
                and (not self.track_u or u == r * b * b)
            )
            return (r,) if ok else None
        # three values a, a+1, a+2 with both sums known: y + 2z = T', y + 4z = U'
        tp = t - a * r
        up = u - 2 * a * t + a * a * r
        if (up - tp) % 2:
            return None
        z = (up - tp) // 2
        y = tp - 2 * z
        x = r - y - z
        counts = (x, y, z)
        if min(counts) < 0:
            return None
        cum = done
        for i, c in enumerate(counts):
            cum += c
            v = a + i
            if not (fr.c_lo[v] <= c <= fr.c_hi[v] and fr.f_lo[v] <= cum <= fr.f_hi[v]):
                return None
        return counts

    def _four(
        self, fr: _Frame, a: int, r: int, t: int, u: int
    ) -> tuple[int, int, tuple[int, ...], tuple[int, ...]] | None:
        """The last four values a..a+3 with both sums known: one free count w = c_{a+3}.

        Solving y + 2z + 3w = T', y + 4z + 9w = U' gives x = X0 - w, y = Y0 + 3w,
        z = Z0 - 3w; every count and cumulative count is linear in w, so the consistent w form
        an interval. Returns (w_lo, w_hi, counts at w_lo, counts at w_hi) or None.
        """
        tp = t - a * r
        up = u - 2 * a * t + a * a * r
        if (up - tp) % 2:
            return None
        x0 = r - (3 * tp - up) // 2
        y0 = 2 * tp - up
        z0 = (up - tp) // 2
        done = self.n - r
        lo, hi = 0, r
        # (offset, slope, lower, upper) for: c_a, c_a+1, c_a+2, c_a+3, F(a), F(a+1), F(a+2)
        rows = (
            (x0, -1, fr.c_lo[a], fr.c_hi[a]),
            (y0, 3, fr.c_lo[a + 1], fr.c_hi[a + 1]),
            (z0, -3, fr.c_lo[a + 2], fr.c_hi[a + 2]),
            (0, 1, fr.c_lo[a + 3], fr.c_hi[a + 3]),
            (done + x0, -1, fr.f_lo[a], fr.f_hi[a]),
            (done + x0 + y0, 2, fr.f_lo[a + 1], fr.f_hi[a + 1]),
            (done + r, -1, fr.f_lo[a + 2], fr.f_hi[a + 2]),
        )
        for off, slope, low, high in rows:
            # low <= off + slope * w <= high
            if slope > 0:
                lo = max(lo, -((off - low) // slope))
                hi = min(hi, (high - off) // slope)
            else:
                lo = max(lo, -((high - off) // -slope))
                hi = min(hi, (off - low) // -slope)
        if lo > hi:
            return None
        return (
            lo,
            hi,
            (x0 - lo, y0 + 3 * lo, z0 - 3 * lo, lo),
            (x0 - hi, y0 + 3 * hi, z0 - 3 * hi, hi),
        )

    def _closed(self, a: int) -> bool:
        return a == self.k - 1 or (self.track_u and a == self.k - 3)

    def count(self, fr: _Frame, a: int, r: int, t: int, u: int) -> int:
        if self._closed(a):
            return 1 if self._last(fr, a, r, t, u) is not None else 0
        if self.track_u and a == self.k - 4:
            four = self._four(fr, a, r, t, u)
            return 0 if four is None else four[1] - four[0] + 1
        key = (a, r, t, u)
        hit = fr.memo.get(key)
        if hit is not None:
            return hit  # type: ignore[return-value]
        total = 0
        for _c, r2, t2, u2 in self._children(fr, a, r, t, u):
            total += self.count(fr, a + 1, r2, t2, u2)
        fr.memo[key] = total
        return total

    def bounds(self, fr: _Frame, a: int, r: int, t: int, u: int) -> _Node | None:
        if self._closed(a):
            forced = self._last(fr, a, r, t, u)
            return None if forced is None else (1, forced, forced)
        if self.track_u and a == self.k - 4:
            four = self._four(fr, a, r, t, u)
            if four is None:
                return None
            w_lo, w_hi, at_lo, at_hi = four
            return (
                w_hi - w_lo + 1,
                tuple(map(min, at_lo, at_hi)),
                tuple(map(max, at_lo, at_hi)),
            )
        key = (a, r, t, u)
        if key in fr.memo:
            return fr.memo[key]  # type: ignore[return-value]
        total = 0
        lows: tuple[int, ...] | None = None
        highs: tuple[int, ...] = ()
        for c, r2, t2, u2 in self._children(fr, a, r, t, u):
            child = self.bounds(fr, a + 1, r2, t2, u2)
            if child is None:
                continue
            cnt, clo, chi = child
            total += cnt
            if lows is None:
                lows, highs = (c, *clo), (c, *chi)
            else:
                lows = (min(lows[0], c), *map(min, lows[1:], clo))
                highs = (max(highs[0], c), *map(max, highs[1:], chi))
        node = None if lows is None else (total, lows, highs)
        fr.memo[key] = node
        return node

    def exists(self, fr: _Frame, a: int, r: int, t: int, u: int) -> bool:
        if self._closed(a):
            return self._last(fr, a, r, t, u) is not None
        if self.track_u and a == self.k - 4:
            return self._four(fr, a, r, t, u) is not None
        key = (a, r, t, u)
        if key in fr.memo:
            return bool(fr.memo[key])
        want = self.hint[a]
        children = sorted(self._children(fr, a, r, t, u), key=lambda ch: abs(ch[0] - want))
        found = any(self.exists(fr, a + 1, *child[1:]) for child in children)
        fr.memo[key] = found
        return found

    def roots(self) -> Iterator[tuple[_Frame, int, int]]:
        for fr in self.frames:
            for t, u in self.targets:
                if self._viable(0, self.n, t, u):
                    yield fr, t, u


def _monotone(assignment: dict[int, int]) -> bool:
    values = [assignment[p] for p in sorted(assignment)]
    return all(x <= y for x, y in pairwise(values))


def analyse(
    cons: SampleConstraints,
    *,
    max_steps: int | None = None,
    time_budget: float | None = None,
) -> MatchResult:
    """Count the samples consistent with `cons` and bound each value's count among them.

    Raises `BudgetExceeded` when more than `max_steps` DP steps (one step: one candidate count of one value in one state) or `time_budget` seconds
    would be needed.
    """
    solver = _Solver(cons, max_steps, time_budget)
    total = 0
    lows: list[int] | None = None
    highs: list[int] = []
    for fr, t, u in solver.roots():
        node = solver.bounds(fr, 0, cons.n, t, u)
        if node is None:
            continue
        cnt, lo, hi = node
        total += cnt
        if lows is None:
            lows, highs = list(lo), list(hi)
        else:
            lows = [min(x, y) for x, y in zip(lows, lo, strict=True)]
            highs = [max(x, y) for x, y in zip(highs, hi, strict=True)]
    if lows is None:
        return MatchResult(0, {})
    values = range(cons.low, cons.high + 1)
    return MatchResult(total, {v: (lo, hi) for v, lo, hi in zip(values, lows, highs, strict=True)})


def count_consistent(
    cons: SampleConstraints, *, max_steps: int | None = None, time_budget: float | None = None
) -> int:
    """Number of samples (multisets) consistent with `cons`, without the per-value bounds.

    A released mean and SD (or variance) alone are counted by nested pivot shells (`shells.py`:
    time grows with the square of the spread, any n up to a few thousand on a 10-point scale),
    else by the pivot method (`pivot.py`), otherwise by the dynamic programme.
    """
    solver = _Solver(cons, max_steps, time_budget)
    pairs = _moment_targets(cons, solver)
    if pairs is not None:
        for method in (count_targets_shells, count_targets):
            fast = method(cons.low, cons.high, cons.n, pairs)
            if fast is not None:
                return fast
    return sum(solver.count(fr, 0, cons.n, t, u) for fr, t, u in solver.roots())


def _moment_targets(cons: SampleConstraints, solver: _Solver) -> list[tuple[int, int]] | None:
    """The admissible (sum, sum of squares) pairs when only moments were released, else None."""
    if not solver.track_u or cons.order:
        return None
    low, n = cons.low, cons.n
    # back from values shifted to start at 0: S = T + n low, Q = U + 2 low S - n low^2
    pairs = []
    for t, u in solver.targets:
        s = t + n * low
        pairs.append((s, u + 2 * low * s - n * low * low))
    return pairs


# the counting route to frequency bounds makes up to 2 k log2(n) counts; it is tried when the
# first count suggests they fit in about this many seconds, and abandoned (for the dynamic
# programme) when they do not fit in twice that
BOUNDS_BY_COUNTING_SECONDS = 3.0


class _TooSlow(Exception):
    """The counting route to frequency bounds ran out of its time."""


def _bounds_by_counting(cons: SampleConstraints) -> dict[int, tuple[int, int]] | None:
    """Per-value least and greatest counts for moments-only constraints, from exact counts:
    the samples with c_v >= t are the samples of n - t values whose sums are S - v t and
    Q - v^2 t; the count is non-increasing in t, so binary searches find where it drops below
    the total (least c_v) and to zero (greatest c_v). None when the counts are unavailable or
    would take too long (the dynamic programme then runs)."""
    solver = _Solver(cons, None, None)
    pairs = _moment_targets(cons, solver)
    if pairs is None:
        return None
    n, low, high = cons.n, cons.low, cons.high
    memo: dict[tuple[int, int], int | None] = {}

    def at_least(v: int, t: int) -> int | None:
        """Consistent samples with at least t records of value v."""
        if time.monotonic() > deadline:
            raise _TooSlow
        if (v, t) not in memo:
            shifted = [(s - v * t, q - v * v * t) for s, q in pairs]
            if t == n:
                memo[v, t] = int((0, 0) in shifted)
            else:
                memo[v, t] = count_targets_shells(low, high, n - t, shifted)
        return memo[v, t]

    started = time.monotonic()
    deadline = started + 2 * BOUNDS_BY_COUNTING_SECONDS
    total = at_least(low, 0)
    if total is None:
        return None
    if total == 0:
        return {}
    calls = 2 * (high - low + 1) * max(1, n.bit_length())
    if (time.monotonic() - started) * calls > BOUNDS_BY_COUNTING_SECONDS:
        return None
    try:
        return _search_bounds(low, high, n, total, memo, at_least)
    except _TooSlow:
        return None


def _search_bounds(
    low: int,
    high: int,
    n: int,
    total: int,
    memo: dict[tuple[int, int], int | None],
    at_least: Callable[[int, int], int | None],
) -> dict[int, tuple[int, int]] | None:
    """The binary searches of `_bounds_by_counting`."""
    bounds: dict[int, tuple[int, int]] = {}
    for v in range(low, high + 1):
        memo[v, 0] = total
        # greatest t with at_least(v, t) > 0
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            found = at_least(v, mid)
            if found is None:
                return None
            lo, hi = (mid, hi) if found > 0 else (lo, mid - 1)
        greatest = lo
        # least t with at_least(v, t + 1) < total: some sample has c_v <= t
        lo, hi = 0, greatest
        while lo < hi:
            mid = (lo + hi) // 2
            found = at_least(v, mid + 1)
            if found is None:
                return None
            lo, hi = (lo, mid) if found < total else (mid + 1, hi)
        bounds[v] = (lo, greatest)
    return bounds


def exists_consistent(
    cons: SampleConstraints,
    count_bounds: Mapping[int, tuple[int, int]],
    *,
    max_steps: int | None = None,
    time_budget: float | None = None,
    hint: Mapping[int, int] | None = None,
) -> bool:
    """Is some sample consistent with `cons` whose count of each value v in `count_bounds`
    lies in the inclusive range given there? Stops at the first one found; `hint` (value ->
    count, e.g. the true sample) steers the search towards samples near it."""
    solver = _Solver(cons, max_steps, time_budget, count_bounds, hint)
    return any(solver.exists(fr, 0, cons.n, t, u) for fr, t, u in solver.roots())


def _mean_sd_constraints(
    k: int, n: int, mean: Number, sd: Number, precision: int | None
) -> SampleConstraints:
    if k < 1:
        raise ReconstructionError(f"the scale needs at least one point, got k={k}")
    return SampleConstraints(
        low=1,
        high=k,
        n=n,
        means=(Admissible.released(mean, precision, ties="half_even"),),
        sds=(Admissible.released(sd, precision, ties="half_even"),),
    )


def count_matching_samples(
    k: int,
    n: int,
    mean: Number,
    sd: Number,
    precision: int | None,
    *,
    max_steps: int | None = None,
) -> int:
    """How many multisets of n values on 1..k have this mean and SD (n - 1 divisor).

    With `precision` the released values are taken as rounded half-to-even to that many
    decimals from the exact statistics; with None they are taken as unrounded (a float within
    1e-9 relative of the exact value). Raises `BudgetExceeded` beyond `max_steps` DP steps (one step: one candidate count of one value in one state).
    """
    return count_consistent(_mean_sd_constraints(k, n, mean, sd, precision), max_steps=max_steps)


def matching_frequency_bounds(
    k: int,
    n: int,
    mean: Number,
    sd: Number,
    precision: int | None,
    *,
    max_steps: int | None = None,
) -> dict[int, tuple[int, int]]:
    """For each value v on 1..k, the least and greatest number of times v occurs among the
    multisets consistent with the released mean and SD; empty when none is consistent.

    Found by binary searches over exact counts (`shells.py`) when those take a few seconds at
    most, otherwise by the dynamic programme, which raises `BudgetExceeded` beyond `max_steps`.
    """
    cons = _mean_sd_constraints(k, n, mean, sd, precision)
    fast = _bounds_by_counting(cons)
    if fast is not None:
        return fast
    return analyse(cons, max_steps=max_steps).bounds
