"""Fast exact counts of samples with given (n, sum, sum of squares), for large n.

Pick two adjacent values a, a+1 near the mean as pivots. With g(v) = (v-a)(v-a-1)/2 (zero at
the pivots, a triangular number 1, 3, 6, ... elsewhere), the three equations
    sum c_v = n,  sum v c_v = S,  sum v^2 c_v = Q
become one equation on the other ("far") values,  sum g(v) c_v = G = (Q - (2a+1) S + a(a+1) n)/2,
plus the two pivot counts, which are then determined:
    c_{a+1} = (S - a n) - l1,   c_a = l2 - (S - (a+1) n),
with l1 = sum (v - a) c_v and l2 = sum (v - a - 1) c_v over far values. Both must be >= 0, so by
inclusion-exclusion

    N = #{g = G} - #{g = G, l1 > P1} - #{g = G, l2 < P2} + #{g = G, l1 > P1, l2 < P2}

(P1 = S - a n, P2 = S - (a+1) n). The first three terms come from two knapsack tables over
(g, l), filled row by row with numpy. In the last term both pivots are negative, which needs at
least n + 2 far records; as each far record has g >= 1, all but a total "excess" of at most
G - n - 2 of g sits on the two cheapest far values (g = 1), so that term is a small sum over the
costlier values plus a closed form for the cheap ones. The method is fast when G is not much
above n, i.e. for the low-to-moderate spread typical of Likert items; otherwise it declines
(returns None) and the general dynamic programme is used.

The tables are kept modulo 2^64 (unsigned numpy integers wrap around for free) and, when the
sample space is larger than that, also modulo primes below 2^31; the Chinese remainder theorem
recombines them. The sample space bounds the answer, so the result is exact.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

WRAP = 2**64  # uint64 arithmetic is arithmetic modulo 2^64
# primes just below 2^31: the sum of two residues stays far below 2^63
_PRIMES = (2147483647, 2147483629, 2147483587, 2147483579, 2147483563, 2147483549)

MAX_TABLE_CELLS = 4_000_000  # per table and modulus: (G + 1) x (range of l)
MAX_EXCESS_CELLS = 8_000_000  # (E + 1)(E/2 + 1)(3E + 1) for excess E = G - n - 2


def count_targets(low: int, high: int, n: int, targets: Sequence[tuple[int, int]]) -> int | None:
    """Number of multisets of n values on low..high whose (sum, sum of squares) is one of
    `targets` (distinct pairs), or None when this method would be too slow for them."""
    if high - low < 3 or not targets:
        return None
    by_pivot: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for s, q in targets:
        a = min(max(s // n, low), high - 1)
        by_pivot[a].append((s, q))
    moduli = moduli_for(math.comb(n + high - low, high - low))
    if moduli is None:
        return None
    total = 0
    for a, group in by_pivot.items():
        part = _count_pivot(low, high, n, a, group, moduli)
        if part is None:
            return None
        total += part
    return total


def moduli_for(bound: int) -> tuple[int, ...] | None:
    chosen, product = [WRAP], WRAP
    for p in _PRIMES:
        if product > bound:
            break
        chosen.append(p)
        product *= p
    return tuple(chosen) if product > bound else None


def _count_pivot(
    low: int, high: int, n: int, a: int, targets: list[tuple[int, int]], moduli: tuple[int, ...]
) -> int | None:
    far = [v for v in range(low, high + 1) if v not in (a, a + 1)]
    g_of = {v: (v - a) * (v - a - 1) // 2 for v in far}
    jobs = []
    for s, q in targets:
        twice_g = q - (2 * a + 1) * s + a * (a + 1) * n
        if twice_g < 0 or twice_g % 2:
            continue
        jobs.append((twice_g // 2, s - a * n, s - (a + 1) * n))
    if not jobs:
        return 0
    g_max = max(g for g, _, _ in jobs)
    # per far record l1 = v - a lies in [-g, 2g] and l2 = v - a - 1 in [-2g, g] (g >= 1)
    width = 3 * g_max + 1
    if (g_max + 1) * width > MAX_TABLE_CELLS:
        return None
    both = _both_pivots_negative(far, g_of, a, n, jobs)
    if both is None:
        return None
    residues = []
    for modulus in moduli:
        r = 0
        # #{g = G} - #{g = G, l1 > P1}, from the (g, l1) table; l1 indexed from -g_max
        table = _table(far, g_of, a, g_max, (1, 2), width, modulus)
        for g, p1, _ in jobs:
            start = min(max(p1 + g_max + 1, 0), width)
            r += int(table[g, :start].sum())
        # - #{g = G, l2 < P2}, from the (g, l2) table; l2 indexed from -2 g_max
        table = _table(far, g_of, a + 1, g_max, (2, 1), width, modulus)
        for g, _, p2 in jobs:
            stop = min(max(p2 + 2 * g_max, 0), width)
            r -= int(table[g, :stop].sum())
        residues.append(r % modulus)
        del table
    return (crt(residues, moduli) + both) % math.prod(moduli)


def _table(
    far: list[int],
    g_of: dict[int, int],
    zero: int,
    g_max: int,
    spread: tuple[int, int],
    width: int,
    modulus: int,
) -> np.ndarray:
    """Counts (mod `modulus`) of far-value multisets by total g and total l = sum (v - zero),
    as table[g, l + spread[0] * g_max]; row g is zero outside -spread[0] g <= l <=
    spread[1] g, so only that band is touched."""
    below, above = spread
    offset = below * g_max
    wrap = modulus == WRAP
    table = np.zeros((g_max + 1, width), dtype=np.uint64 if wrap else np.int64)
    table[0, offset] = 1
    for v in far:
        gv, lv = g_of[v], v - zero
        for g in range(gv, g_max + 1):
            h = g - gv
            lo, hi = offset - below * h, offset + above * h + 1  # source band
            dst = table[g, lo + lv : hi + lv]
            dst += table[h, lo:hi]
            if not wrap:
                dst %= modulus
    return table


def _both_pivots_negative(
    far: list[int], g_of: dict[int, int], a: int, n: int, jobs: list[tuple[int, int, int]]
) -> int | None:
    """The last inclusion-exclusion term summed over the jobs (G, P1, P2), exactly; None when
    it would be too large to compute quickly."""
    excess_max = max(g - n - 2 for g, _, _ in jobs)
    if excess_max < 0:
        return 0
    if (excess_max + 1) * (excess_max // 2 + 1) * (3 * excess_max + 1) > MAX_EXCESS_CELLS:
        return None
    costly = [v for v in far if g_of[v] > 1]
    # costly records by (excess, count, l1): each has excess g - 1 >= 2 and -e <= l1 <= 1.5 e
    half = excess_max // 2
    l_off = excess_max
    dense = np.zeros((excess_max + 1, half + 1, 3 * excess_max + 1), dtype=np.int64)
    dense[0, 0, l_off] = 1
    for v in costly:
        ev, lv = g_of[v] - 1, v - a
        for ex in range(ev, excess_max + 1):
            src = dense[ex - ev, :half, :]
            dst = dense[ex, 1:, :]
            if lv >= 0:
                dst[:, lv:] += src[:, : src.shape[1] - lv]
            else:
                dst[:, :lv] += src[:, -lv:]
    e, m, l_index = np.nonzero(dense)  # row-major order: sorted by excess e
    ways = dense[e, m, l_index]
    l1 = l_index - l_off
    l2 = l1 - m
    if ways.size and int(ways.max()) * (max(g for g, _, _ in jobs) + 1) * ways.size >= 2**62:
        return None  # an int64 dot product could overflow
    up = (a + 2) in far  # the cheap values (g = 1), where they are on the scale
    down = (a - 1) in far
    total = 0
    for g, p1, p2 in jobs:
        # both pivots negative needs n + 2 far records, so excess e <= G - n - 2
        k = int(np.searchsorted(e, g - n - 2, side="right"))
        if k == 0:
            continue
        mk, l1k, l2k = m[:k], l1[:k], l2[:k]
        mc = g - (mk + e[:k])  # records on the cheap values
        # p records at a+2 (l1 += 2, l2 += 1) and mc - p at a-1 (l1 -= 1, l2 -= 2); both
        # pivots negative: l1 - mc + 3p > P1 and l2 - 2 mc + 3p < P2
        p_lo = np.maximum(np.zeros_like(mc) if down else mc, (p1 - l1k + mc) // 3 + 1)
        p_hi = np.minimum(mc if up else np.zeros_like(mc), -(-(p2 - l2k + 2 * mc) // 3) - 1)
        total += int(np.dot(ways[:k], np.maximum(p_hi - p_lo + 1, 0)))
    return total


def crt(residues: list[int], moduli: tuple[int, ...]) -> int:
    value, modulus = 0, 1
    for r, p in zip(residues, moduli, strict=True):
        # value + modulus * t = r (mod p)
        t = ((r - value) * pow(modulus, -1, p)) % p
        value += modulus * t
        modulus *= p
    return value
