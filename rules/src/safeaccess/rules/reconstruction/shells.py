"""Exact counts of samples with given (n, sum, sum of squares) by nested pivot shells.

A generalisation of `pivot.py` whose cost grows with the square of the spread, not its cube,
so that data spread over a whole 10-point scale are counted for n in the thousands.

Counts vectors c over the values low..high with a *sign pattern*: values in a set Neg have
c_v <= -1, all others ("Pos") c_v >= 0, and sum c = n, sum v c = S, sum v^2 c = Q. Ordinary
samples are the pattern Neg = {} (level 0). At each level two Pos values x1 < x2 are pivots and
q(v) = s (v - x1)(v - x2), with s = +1 when Neg lies between the pivots and Pos outside
("inner" shell) and s = -1 when Pos lies between them and Neg outside ("outer" shell). Either
way every non-pivot record adds a positive cost: q(v) > 0 on Pos, and on Neg, where c_v =
-1 - d_v, each unit of d_v adds -q(v) > 0. So the vectors are multisets of positive-cost items
with total cost exactly C (a function of n, S, Q), and the three equations fix the two pivot
counts from the items' sums l1 = sum (v - x1) c and l2 = sum (x2 - v) c:

    c_x2 = (A1 - l1) / (x2 - x1),   c_x1 = (A2 - l2) / (x2 - x1).

Two knapsack tables by (cost, l1) and (cost, l2) give, by inclusion-exclusion,

    N(level) = #{c_x2 >= 0} - #{c_x1 < 0} + N(next level),

where the next level is the same pattern with both pivots moved into Neg: the count of vectors
whose pivots are both negative. Its pivots are the next Pos values outwards (inner shells) or,
once a scale end is reached, inwards from the ends (outer shells). Each level's total cost C
drops by about n times the growth of q, so only a few levels are non-empty; the recursion ends
when C < 0 or when fewer than two Pos values remain (no vector then: with none, sum c < 0; with
one value w, sum (v - w)^2 c < 0 although it must equal n Var + n (mean - w)^2 >= 0).

Tables are kept modulo 2^64 and, when the answer could be larger, primes just below 2^20
(CRT). The answer is at most the number of multisets whose sum is admissible (a Gaussian
binomial coefficient, computed exactly); single shells' terms are not, so residues are summed
over the shells and recombined once. A row of cost g spans only the l between the extreme
ratios l / cost of the items, cut further where no query can be reached, so a table has at
most about (ratio range) C^2 / 2 cells; above `MAX_CELLS` the method declines (returns None).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from safeaccess.rules.reconstruction.pivot import WRAP, crt

MAX_CELLS = 30_000_000  # per table and modulus (uint64: 240 MB at the limit)
MAX_LEVELS = 64
# Primes just below 2^20: small residues let a table take several items between reductions
# (a pass multiplies the largest entry by at most c_max + 1), and `%` is the costly step.
PRIMES = (1048573, 1048571, 1048559, 1048549, 1048517, 1048507, 1048447, 1048433)
_LIMIT = 2**62


def moduli_for(bound: int) -> tuple[int, ...] | None:
    """2^64 and as many of `PRIMES` as make the product exceed `bound` (None: not enough)."""
    chosen, product = [WRAP], WRAP
    for p in PRIMES:
        if product > bound:
            break
        chosen.append(p)
        product *= p
    return tuple(chosen) if product > bound else None


@dataclass(frozen=True)
class _Item:
    cost: int  # after division by the level's common factor
    l1: int
    l2: int


@dataclass(frozen=True)
class _Level:
    """One sign pattern and its pivots."""

    neg: frozenset[int]
    x1: int
    x2: int
    sign: int  # +1: Neg between the pivots; -1: Pos between them

    def q(self, v: int) -> int:
        return self.sign * (v - self.x1) * (v - self.x2)


def count_targets_shells(
    low: int, high: int, n: int, targets: Sequence[tuple[int, int]]
) -> int | None:
    """Number of multisets of n values on low..high whose (sum, sum of squares) is one of
    `targets` (distinct pairs), or None when a table would exceed `MAX_CELLS`."""
    if high - low < 1 or not targets:
        return None
    by_pivot: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for s, q in targets:
        if n * q < s * s:
            continue  # negative variance: no sample
        by_pivot[min(max(s // n, low), high - 1)].append((s, q))
    return _count_groups(low, high, n, by_pivot)


def _count_groups(
    low: int, high: int, n: int, by_pivot: Mapping[int, list[tuple[int, int]]]
) -> int | None:
    """The count for (sum, sum of squares) jobs grouped by their first pivot a (any a in
    low..high-1 gives the same count; one near the mean gives the smallest tables)."""
    plans = []  # every shell of every first pivot, sized before anything is built
    for a, jobs in by_pivot.items():
        shells = _plan(low, high, n, a, jobs)
        if shells is None:
            return None
        plans.append(shells)
    sums = {s for jobs in by_pivot.values() for s, _ in jobs}
    moduli = moduli_for(_bound(low, high, n, sums))
    if moduli is None:
        return None
    largest = max((t.cells for shells in plans for sh in shells for t in sh.tables), default=0)
    scratch = np.empty(largest, dtype=np.uint64)  # one buffer: fresh pages are slow to touch
    total = 0
    for shells in plans:
        # N = sum over shells of (#{c_x2 >= 0} - #{c_x1 < 0}); single shells' terms may
        # exceed the sample space, their sum does not: add residues, recombine once
        residues = [sum(sh.residue(m, scratch) for sh in shells) % m for m in moduli]
        total += crt(residues, moduli)
    return total


def _bound(low: int, high: int, n: int, sums: set[int]) -> int:
    """An upper bound on the answer: the multisets whose sum is one of `sums` (exactly, from
    the Gaussian binomial [n + k - 1 choose k - 1]_q), when the sample space is above 2^64."""
    k1 = high - low
    space = math.comb(n + k1, k1)
    if space < WRAP:
        return space
    poly = multisets_by_sum(n, k1)
    return sum(poly[s - n * low] for s in sums if 0 <= s - n * low <= n * k1)


@functools.lru_cache(maxsize=32)
def multisets_by_sum(n: int, k1: int) -> tuple[int, ...]:
    """Number of multisets of n values on 0..k1 by their sum: the coefficients of the Gaussian
    binomial [n + k1 choose k1]_q = prod_{i=1}^{k1} (1 - q^(n+i)) / (1 - q^i)."""
    poly = [1] + [0] * (n * k1)
    for i in range(1, k1 + 1):
        # every partial product is itself a Gaussian binomial, so all stay integers >= 0
        for j in range(n * k1, n + i - 1, -1):
            poly[j] -= poly[j - n - i]
        for j in range(i, n * k1 + 1):
            poly[j] += poly[j - i]
    return tuple(poly)


def _plan(low: int, high: int, n: int, a: int, jobs: list[tuple[int, int]]) -> list[_Shell] | None:
    """The non-empty shells for the jobs sharing the first pivots a, a+1 (None: too big)."""
    level: _Level | None = _Level(frozenset(), a, a + 1, 1)
    shells: list[_Shell] = []
    for _ in range(MAX_LEVELS):
        if level is None:
            return shells
        shell = _Shell.of(low, high, n, level, jobs)
        if isinstance(shell, _Empty):
            return shells
        if shell is not None:
            if max(t.cells for t in shell.tables) > MAX_CELLS:
                return None
            shells.append(shell)
        level = _next_level(low, high, n, level, jobs)
        if level is _DECLINE:
            return None
    return None


def _next_level(
    low: int, high: int, n: int, level: _Level, jobs: list[tuple[int, int]]
) -> _Level | None:
    """The pattern of vectors whose two pivots are both negative, with its pivots; None when
    no such vector can exist, `_DECLINE` when that cannot be shown."""
    neg = level.neg | {level.x1, level.x2}
    pos = [v for v in range(low, high + 1) if v not in neg]
    if len(pos) < 2:
        if pos:
            w = pos[0]
            # one Pos value w: sum (v - w)^2 c_v < 0 on the Neg values, yet it equals Q - 2wS + w^2 n
            if any(q - 2 * w * s + w * w * n < 0 for s, q in jobs):
                return _DECLINE
        return None
    if level.sign == 1 and level.x1 > low and level.x2 < high:
        return _Level(neg, level.x1 - 1, level.x2 + 1, 1)
    # Pos is now one interval (a scale end was reached, or already an outer shell)
    return _Level(neg, pos[0], pos[-1], -1)


@dataclass
class _Shell:
    """One level's queries (cost C, A1, A2) and its two tables."""

    tasks: list[tuple[int, int, int]]
    span: int
    tables: tuple[_Table, _Table]

    @classmethod
    def of(
        cls, low: int, high: int, n: int, level: _Level, jobs: list[tuple[int, int]]
    ) -> _Shell | _Empty | None:
        """The shell at `level` (None: no job has a usable cost here, but deeper ones may;
        `_EMPTY`: every job's cost is negative, so this and all deeper shells are empty)."""
        x1, x2 = level.x1, level.x2
        raw = []
        for v in range(low, high + 1):
            if v in (x1, x2):
                continue
            if v in level.neg:
                raw.append((-level.q(v), -(v - x1), -(x2 - v)))
            else:
                raw.append((level.q(v), v - x1, x2 - v))
        if any(c <= 0 for c, _, _ in raw):
            raise AssertionError("pivots are chosen so that every item has a positive cost")
        unit = math.gcd(*(c for c, _, _ in raw)) if raw else 1
        items = [_Item(c // unit, l1, l2) for c, l1, l2 in raw]
        neg_q = sum(level.q(v) for v in level.neg)
        neg_l1 = sum(v - x1 for v in level.neg)
        neg_l2 = sum(x2 - v for v in level.neg)
        tasks = []  # (cost, A1, A2)
        any_nonneg = False
        for s, q in jobs:
            cost = level.sign * (q - (x1 + x2) * s + x1 * x2 * n) + neg_q
            any_nonneg = any_nonneg or cost >= 0
            if cost >= 0 and cost % unit == 0:
                tasks.append((cost // unit, s - x1 * n + neg_l1, x2 * n - s + neg_l2))
        if not any_nonneg:
            return _EMPTY
        if not tasks:
            return None
        c_max = max(c for c, _, _ in tasks)
        # queries read l1 <= A1 (prefix) and l2 > A2 (suffix) of row C
        one = _Table(items, c_max, lambda it: it.l1, prefix=[(c, a1) for c, a1, _ in tasks])
        two = _Table(items, c_max, lambda it: it.l2, suffix=[(c, a2 + 1) for c, _, a2 in tasks])
        return cls(tasks, x2 - x1, (one, two))

    def residue(self, modulus: int, scratch: np.ndarray) -> int:
        """Sum over the tasks of #{c_x2 >= 0} - #{c_x1 < 0}, modulo `modulus`."""
        one, two = self.tables
        r = 0
        rows = one.build(modulus, scratch)
        for c, a1, _ in self.tasks:  # c_x2 >= 0: l1 <= A1, l1 = A1 (mod span)
            r += one.sum_upto(rows[c], c, a1, self.span)
        rows = two.build(modulus, scratch)
        for c, _, a2 in self.tasks:  # c_x1 < 0: l2 > A2, l2 = A2 (mod span)
            r -= two.sum_above(rows[c], c, a2, self.span)
        return r % modulus


class _Empty:
    """Marker type of `_EMPTY`."""


_EMPTY = _Empty()
# marker: a pattern whose emptiness could not be shown
_DECLINE = _Level(frozenset(), 0, 0, 0)


class _Table:
    """Knapsack counts by (cost, l) for one level, rows stored by cost over their l band."""

    def __init__(
        self,
        items: list[_Item],
        c_max: int,
        key: Callable[[_Item], int],
        prefix: Sequence[tuple[int, int]] = (),
        suffix: Sequence[tuple[int, int]] = (),
    ) -> None:
        """`prefix` (cost C, bound B): only l <= B of row C will be read; `suffix`: l >= B."""
        self.pairs = [(it.cost, key(it)) for it in items]
        self.c_max = c_max
        down = max((Fraction(-lv, c) for c, lv in self.pairs if lv < 0), default=Fraction(0))
        up = max((Fraction(lv, c) for c, lv in self.pairs if lv > 0), default=Fraction(0))
        g = np.arange(c_max + 1, dtype=np.int64)
        # row g spans l in [lo[g], hi[g]]: the items' extreme ratios l / cost times g ...
        lo = -((down.numerator * g) // down.denominator)
        hi = (up.numerator * g) // up.denominator
        # ... cut where no query can be reached: adding cost C - g moves l down by at most
        # down (C - g) and up by at most up (C - g); cut entries only ever feed cut entries
        if prefix:
            reach = max(b + down * c for c, b in prefix)  # keep l <= reach - down g
            den = reach.denominator * down.denominator
            top = reach.numerator * down.denominator - down.numerator * reach.denominator * g
            hi = np.minimum(hi, top // den)
        if suffix:
            reach = min(b - up * c for c, b in suffix)  # keep l >= reach + up g
            den = reach.denominator * up.denominator
            bottom = reach.numerator * up.denominator + up.numerator * reach.denominator * g
            lo = np.maximum(lo, -((-bottom) // den))
        self.lo = lo
        self.hi = np.maximum(hi, lo - 1)  # empty rows have width 0
        self.start = np.concatenate(([0], np.cumsum(self.hi - self.lo + 1)))
        self.cells = int(self.start[-1])

    def build(self, modulus: int, scratch: np.ndarray) -> list[np.ndarray]:
        """Rows by cost, modulo `modulus`, as views into `scratch` (uint64, overwritten)."""
        wrap = modulus == WRAP
        flat = scratch[: self.cells]
        if not wrap:
            flat = flat.view(np.int64)
        flat.fill(0)
        start, lo, hi = self.start.tolist(), self.lo.tolist(), self.hi.tolist()
        rows = [flat[start[g] : start[g + 1]] for g in range(self.c_max + 1)]
        if lo[0] <= 0 <= hi[0]:
            rows[0][-lo[0]] = 1
        largest = 1  # bound on every entry (prime moduli only: uint64 wraps by itself)
        for cv, lv in self.pairs:
            growth = self.c_max // cv + 1  # an entry gains at most this many earlier ones
            if not wrap and largest * growth >= _LIMIT:
                flat %= modulus
                largest = modulus - 1
            # ascending g: row g - cv already holds any number of copies of this item
            for g in range(cv, self.c_max + 1):
                s_lo = lo[g - cv] + lv  # the source row moved by this item
                d_lo, d_hi = max(s_lo, lo[g]), min(hi[g - cv] + lv, hi[g])
                if d_lo <= d_hi:
                    rows[g][d_lo - lo[g] : d_hi - lo[g] + 1] += rows[g - cv][
                        d_lo - s_lo : d_hi - s_lo + 1
                    ]
            largest *= growth
        if not wrap:
            flat %= modulus  # queries sum whole rows: entries must be small again
        return rows

    def sum_upto(self, row: np.ndarray, g: int, bound: int, step: int) -> int:
        """Sum of row entries at l <= bound with l = bound (mod step)."""
        lo = int(self.lo[g])
        if bound < lo:
            return 0
        first = lo + (bound - lo) % step
        stop = min(bound, lo + row.size - 1)
        if first > stop:
            return 0
        return int(row[first - lo : stop - lo + 1 : step].sum())

    def sum_above(self, row: np.ndarray, g: int, bound: int, step: int) -> int:
        """Sum of row entries at l > bound with l = bound (mod step)."""
        lo = int(self.lo[g])
        first = bound + step
        if first < lo:
            first = lo + (bound - lo) % step
        if first - lo >= row.size:
            return 0
        return int(row[first - lo :: step].sum())
