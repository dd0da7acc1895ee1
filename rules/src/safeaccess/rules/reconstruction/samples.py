"""How many samples on a k-point scale are uniquely identified by their summary statistics.

This reproduces the measure of Derrick, Green, Ritchie & White (PSD 2022): among all multisets
of n values on 1..k (the sample space), count those whose statistics no other multiset shares.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterator
from fractions import Fraction
from itertools import combinations_with_replacement
from typing import Literal

from safeaccess.rules.reconstruction._exact import (
    ReconstructionError,
    median_weights,
    quantile_weights,
    round_half_even,
    round_sqrt_half_even,
    weighted_order_statistic,
)

Statistics = Literal["mean_sd", "median_quartiles", "median_min_max"]

# Enumerating more multisets than this takes minutes in Python; refuse rather than hang.
MAX_ENUMERATED_SAMPLES = 3_000_000


def sample_space_size(k: int, n: int) -> int:
    """Number of multisets of size n on the scale 1..k: C(n + k - 1, n)."""
    _check_kn(k, n)
    return math.comb(n + k - 1, n)


def count_unique_samples(
    k: int,
    n: int,
    statistics: Statistics,
    precision: int | None = None,
    quantile_type: int | None = None,
) -> int:
    """Count the multisets of size n on 1..k that `statistics` identify uniquely.

    - "mean_sd": mean and SD (n - 1 divisor). `precision=None` compares exactly, on the key
      (n, sum x, sum x^2); otherwise both are rounded half-to-even to `precision` decimals,
      from their exact values.
    - "median_quartiles": median and the Hyndman-Fan `quantile_type` quartiles (p = 0.25, 0.75),
      exact. `quantile_type` is required (6: SPSS/Minitab, 7: R, 2: SAS).
    - "median_min_max": median, minimum and maximum, exact.
    """
    _check_kn(k, n)
    if statistics == "mean_sd":
        if n < 2:
            raise ReconstructionError("the SD needs n >= 2")
        if precision is not None and precision < 0:
            raise ReconstructionError(f"precision must be >= 0, got {precision}")
        return _unique_mean_sd(k, n, precision)
    if precision is not None:
        raise ReconstructionError(f"precision applies to 'mean_sd' only, not {statistics!r}")
    if statistics == "median_quartiles":
        if quantile_type is None:
            raise ReconstructionError("'median_quartiles' needs quantile_type (e.g. 2, 6 or 7)")
        q1 = quantile_weights(n, Fraction(1, 4), quantile_type)
        q3 = quantile_weights(n, Fraction(3, 4), quantile_type)
        med = median_weights(n)
        keys: Iterator[Hashable] = (
            (
                weighted_order_statistic(x, med),
                weighted_order_statistic(x, q1),
                weighted_order_statistic(x, q3),
            )
            for x in _multisets(k, n)
        )
    elif statistics == "median_min_max":
        med = median_weights(n)
        keys = ((weighted_order_statistic(x, med), x[0], x[-1]) for x in _multisets(k, n))
    else:
        raise ReconstructionError(
            f"unknown statistics {statistics!r}; use 'mean_sd', 'median_quartiles' "
            "or 'median_min_max'"
        )
    return sum(1 for c in Counter(keys).values() if c == 1)


def sum_square_multiplicities(k: int, n: int) -> dict[tuple[int, int], int]:
    """For every (sum x, sum x^2) reachable by a multiset of size n on 1..k, how many reach it.

    A dynamic programme over the values 1..k with state (items so far, sum, sum of squares):
    polynomial in n and k, unlike enumerating the C(n + k - 1, n) multisets.
    """
    _check_kn(k, n)
    layer: dict[tuple[int, int, int], int] = {(0, 0, 0): 1}
    for v in range(1, k + 1):
        nxt: dict[tuple[int, int, int], int] = {}
        for (m, s, q), ways in layer.items():
            for c in range(n - m + 1):
                key = (m + c, s + c * v, q + c * v * v)
                nxt[key] = nxt.get(key, 0) + ways
        layer = nxt
    return {(s, q): ways for (m, s, q), ways in layer.items() if m == n}


def _unique_mean_sd(k: int, n: int, precision: int | None) -> int:
    mult = sum_square_multiplicities(k, n)
    if precision is None:
        return sum(1 for ways in mult.values() if ways == 1)
    groups: Counter[tuple[Fraction, Fraction]] = Counter()
    for (s, q), ways in mult.items():
        variance = Fraction(n * q - s * s, n * (n - 1))
        key = (
            round_half_even(Fraction(s, n), precision),
            round_sqrt_half_even(variance, precision),
        )
        groups[key] += ways
    return sum(1 for ways in groups.values() if ways == 1)


def _multisets(k: int, n: int) -> Iterator[tuple[int, ...]]:
    size = math.comb(n + k - 1, n)
    if size > MAX_ENUMERATED_SAMPLES:
        raise ReconstructionError(
            f"the sample space for k={k}, n={n} has {size} multisets; quantile statistics are "
            f"counted by enumeration, limited to {MAX_ENUMERATED_SAMPLES}"
        )
    return combinations_with_replacement(range(1, k + 1), n)


def _check_kn(k: int, n: int) -> None:
    if k < 1:
        raise ReconstructionError(f"the scale needs at least one point, got k={k}")
    if n < 1:
        raise ReconstructionError(f"the sample needs at least one value, got n={n}")
