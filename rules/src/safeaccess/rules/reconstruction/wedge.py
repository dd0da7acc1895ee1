"""Exact counts of samples with given (n, sum, sum of squares) for spread-out data.

Same coordinates as `pivot.py`: two adjacent pivot values a, a+1 cost nothing, every other
("far") value v costs g(v) = (v-a)(v-a-1)/2 >= 1, and a sample is a multiset of far records
with total cost exactly G plus the pivot counts they imply,

    c_{a+1} = P1 - l1,   c_a = l1 - m - P2        (l1 = sum (v - a), m = far records).

`pivot.py` counts the far multisets with both pivot counts >= 0 by inclusion-exclusion, whose
last term (both pivots negative) grows with the cube of G - n and so fails on data spread over
the whole scale. Here the "wedge" P2 + m <= l1 <= P1 is counted directly instead:

- the *costly* far values (g >= 3) go into a table D[g][m, l1] (by total cost, number of
  records and l1), kept triangular: a row of cost g holds at most g // 3 records and l1 within
  the ratio bounds of the costly values, so it is about a third of a dense cube;
- the *cheap* values a-1 and a+2 (g = 1) fill the remaining cost G - g exactly, with p records
  at a+2 and the rest at a-1; the wedge is then an interval of p, counted in closed form.

Arithmetic is modulo 2^64 (uint64 wraps for free) and, when the sample space is larger, also
modulo primes below 2^31, recombined by the Chinese remainder theorem; the sample space bounds
the answer, so the result is exact. Cost: about (5/27) G^3 table cells times the number of
costly values, against the DP's state space; it declines (returns None) above `MAX_CELLS`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from safeaccess.rules.reconstruction.pivot import WRAP, crt, moduli_for

MAX_CELLS = 16_000_000  # table cells per modulus (uint64: 128 MB at the limit)


def count_targets_wedge(
    low: int, high: int, n: int, targets: Sequence[tuple[int, int]]
) -> int | None:
    """Number of multisets of n values on low..high whose (sum, sum of squares) is one of
    `targets` (distinct pairs), or None when the table would exceed `MAX_CELLS`."""
    if high - low < 3 or not targets:
        return None
    by_pivot: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for s, q in targets:
        a = min(max(s // n, low), high - 1)
        twice_g = q - (2 * a + 1) * s + a * (a + 1) * n
        if twice_g < 0 or twice_g % 2:
            continue  # no integer sample: g is a sum of integers
        by_pivot[a].append((twice_g // 2, s - a * n, s - (a + 1) * n))
    moduli = moduli_for(math.comb(n + high - low, high - low))
    if moduli is None:
        return None
    plans = []
    for a, jobs in by_pivot.items():
        plan = _Plan(low, high, n, a, jobs)
        if plan.cells > MAX_CELLS:
            return None
        plans.append(plan)
    return sum(plan.count(moduli) for plan in plans)


class _Plan:
    """One pivot a and the (G, P1, P2) jobs that share its table."""

    def __init__(self, low: int, high: int, n: int, a: int, jobs: list[tuple[int, int, int]]):
        self.n = n
        self.jobs = jobs
        self.g_max = max(g for g, _, _ in jobs)
        far = [v for v in range(low, high + 1) if v not in (a, a + 1)]
        cost = {v: (v - a) * (v - a - 1) // 2 for v in far}
        self.up = a + 2 <= high  # cheap values present on the scale
        self.down = a - 1 >= low
        # costly values as (cost, l1); l1 per unit cost lies in [-down_ratio, up_ratio]
        self.items = [(cost[v], v - a) for v in far if cost[v] > 1]
        self.down_ratio = max((Fraction(-lv, c) for c, lv in self.items if lv < 0), default=None)
        self.up_ratio = max((Fraction(lv, c) for c, lv in self.items if lv > 0), default=None)
        self.cells = sum(self._rows(g) * self._width(g) for g in range(self.g_max + 1))

    # row g: m in [0, _rows(g)), l1 in [_l_lo(g), _l_lo(g) + _width(g))
    def _rows(self, g: int) -> int:
        return min(g // 3, self.n) + 1

    def _l_lo(self, g: int) -> int:
        return 0 if self.down_ratio is None else -math.floor(self.down_ratio * g)

    def _width(self, g: int) -> int:
        hi = 0 if self.up_ratio is None else math.floor(self.up_ratio * g)
        return hi - self._l_lo(g) + 1

    def _table(self, modulus: int) -> list[np.ndarray]:
        """D[g][m, l1 - l_lo(g)]: costly multisets of cost g with m records, modulo `modulus`."""
        wrap = modulus == WRAP
        dtype = np.uint64 if wrap else np.int64
        rows = [
            np.zeros((self._rows(g), self._width(g)), dtype=dtype) for g in range(self.g_max + 1)
        ]
        rows[0][0, 0] = 1
        for gv, lv in self.items:
            # unbounded knapsack: ascending g lets row g - gv already hold copies of this value
            for g in range(gv, self.g_max + 1):
                src = rows[g - gv]
                r, w = src.shape
                shift = self._l_lo(g - gv) + lv - self._l_lo(g)
                if r > self.n:  # the record would exceed n: such multisets never count
                    r -= 1
                dst = rows[g][1 : r + 1, shift : shift + w]
                dst += src[:r]
                if not wrap:
                    dst %= modulus
        return rows

    def count(self, moduli: tuple[int, ...]) -> int:
        """The exact number of samples over this plan's jobs."""
        residues = []
        for modulus in moduli:
            rows = self._table(modulus)
            residues.append(sum(self._job(rows, job, modulus) for job in self.jobs) % modulus)
            del rows
        return crt(residues, moduli)

    def _job(self, rows: list[np.ndarray], job: tuple[int, int, int], modulus: int) -> int:
        g_total, p1, p2 = job
        total = 0
        # the cheap records number G - g and, with every far record, at most n
        for g in range(max(0, g_total - self.n), g_total + 1):
            row = rows[g]
            cheap = g_total - g
            m = np.arange(row.shape[0], dtype=np.int64)[:, None]
            l1 = np.arange(row.shape[1], dtype=np.int64)[None, :] + self._l_lo(g)
            # p records at a+2 (l1 += 2), cheap - p at a-1 (l1 -= 1), m += cheap;
            # wedge P2 + m <= l1 <= P1  <=>  lower <= 3p <= upper
            lower = p2 + m + 2 * cheap - l1
            upper = p1 + cheap - l1
            p_lo = np.maximum(0 if self.down else cheap, -((-lower) // 3))
            p_hi = np.minimum(cheap if self.up else 0, upper // 3)
            ways = np.maximum(p_hi - p_lo + 1, 0)
            ways[m[:, 0] + cheap > self.n, :] = 0
            if modulus == WRAP:
                total += int((row * ways.astype(np.uint64)).sum(dtype=np.uint64))
            else:
                total += int(((row * ways) % modulus).sum())
        return total % modulus
