"""An independent brute-force oracle for the reconstruction tests, and checks of the oracle.

It enumerates every multiset, computes statistics with Decimal square roots and numpy's
quantile implementations (not the product's exact helpers), and compares released values
the way a reader would: does the statistic round to what was printed?
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from fractions import Fraction
from itertools import combinations_with_replacement
from typing import Any

import numpy as np

NUMPY_METHOD = {
    1: "inverted_cdf",
    2: "averaged_inverted_cdf",
    3: "closest_observation",
    4: "interpolated_inverted_cdf",
    5: "hazen",
    6: "weibull",
    7: "linear",
    8: "median_unbiased",
    9: "normal_unbiased",
}

Sample = tuple[int, ...]


def samples(low: int, high: int, n: int) -> Iterator[Sample]:
    return combinations_with_replacement(range(low, high + 1), n)


def mean_of(x: Sample) -> Fraction:
    return Fraction(sum(x), len(x))


def variance_of(x: Sample) -> Fraction:
    n, s, q = len(x), sum(x), sum(v * v for v in x)
    return Fraction(n * q - s * s, n * (n - 1))


def round_dec(x: Fraction, d: int) -> Decimal:
    """Round half-to-even with the decimal module at high precision (exact for rationals with
    short expansions, which is all these tests produce)."""
    with localcontext() as ctx:
        ctx.prec = 80
        value = Decimal(x.numerator) / Decimal(x.denominator)
        return value.quantize(Decimal(1).scaleb(-d), rounding=ROUND_HALF_EVEN)


def round_sd(var: Fraction, d: int) -> Decimal:
    """SD rounded half-to-even: Decimal square root, with exact ties settled by squaring."""
    with localcontext() as ctx:
        ctx.prec = 80
        root = (Decimal(var.numerator) / Decimal(var.denominator)).sqrt()
        step = Decimal(1).scaleb(-d)
        below = root.quantize(step, rounding="ROUND_FLOOR")
        tie = below + step / 2
        tie_f = Fraction(tie)
        if tie_f * tie_f == var:  # an exact tie: go to the even neighbour
            return below if int(below.scaleb(d)) % 2 == 0 else below + step
        return root.quantize(step, rounding=ROUND_HALF_EVEN)


def quantile_of(x: Sample, p: float, qtype: int) -> Fraction:
    method: Any = NUMPY_METHOD[qtype]
    value = float(np.quantile(np.array(x, dtype=float), p, method=method))
    return Fraction(value).limit_denominator(10_000)


def median_of(x: Sample) -> Fraction:
    return Fraction(float(np.median(np.array(x, dtype=float)))).limit_denominator(10_000)


def matching(low: int, high: int, n: int, keep: Callable[[Sample], bool]) -> list[Sample]:
    return [x for x in samples(low, high, n) if keep(x)]


def frequency_bounds(found: list[Sample], low: int, high: int) -> dict[int, tuple[int, int]]:
    counts = [Counter(x) for x in found]
    return {v: (min(c[v] for c in counts), max(c[v] for c in counts)) for v in range(low, high + 1)}


# -- the oracle itself is checked against facts stated in the paper ------------------------


def test_oracle_sample_space_is_the_multiset_count() -> None:
    assert sum(1 for _ in samples(1, 5, 5)) == 126 == math.comb(9, 5)


def test_oracle_reproduces_the_papers_asian_group() -> None:
    # Derrick et al., section 1: n=6 on a 4-point scale, mean 2.67 and SD 0.816 fit exactly
    # {1,3,3,3,3,3} and {2,2,2,3,3,4}.
    found = matching(
        1,
        4,
        6,
        lambda x: (
            round_dec(mean_of(x), 2) == Decimal("2.67")
            and round_sd(variance_of(x), 3) == Decimal("0.816")
        ),
    )
    assert sorted(found) == [(1, 3, 3, 3, 3, 3), (2, 2, 2, 3, 3, 4)]


def test_oracle_rounding_ties_go_to_even() -> None:
    assert round_dec(Fraction(1, 8), 2) == Decimal("0.12")
    assert round_dec(Fraction(3, 8), 2) == Decimal("0.38")
    assert round_sd(Fraction(1, 64), 2) == Decimal("0.12")  # sqrt = 0.125 exactly
    assert round_sd(Fraction(9, 64), 2) == Decimal("0.38")  # sqrt = 0.375 exactly
