"""Derrick et al.'s unique-sample counts: the corrected k = 5 table and brute-force checks."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from test_reconstruction_oracle import (
    mean_of,
    median_of,
    quantile_of,
    round_dec,
    round_sd,
    samples,
    variance_of,
)

from safeaccess.rules.reconstruction import (
    ReconstructionError,
    count_unique_samples,
    sample_space_size,
)
from safeaccess.rules.reconstruction.samples import sum_square_multiplicities

# The lead's recomputation of Table A1 (papers/README.md errata): n, sample space, mean+SD
# exact, 2 dp, 1 dp, Hyndman-Fan type 6, type 7, type 2, median+min+max.
K5_TABLE = [
    (3, 35, 33, 33, 33, 35, 35, 35, 35),
    (4, 70, 56, 56, 56, 70, 70, 68, 41),
    (5, 126, 79, 79, 79, 48, 5, 5, 5),
    (6, 210, 101, 101, 101, 151, 15, 4, 9),
    (7, 330, 121, 121, 121, 0, 16, 0, 5),
    (8, 495, 141, 141, 133, 39, 39, 16, 9),
    (9, 715, 161, 161, 135, 0, 0, 0, 5),
    (10, 1001, 181, 181, 157, 7, 39, 0, 9),
    (11, 1365, 201, 201, 130, 0, 0, 0, 5),
    (12, 1820, 221, 221, 149, 7, 7, 0, 9),
]


@pytest.mark.parametrize("row", K5_TABLE, ids=[f"n={r[0]}" for r in K5_TABLE])
def test_k5_table(row: tuple[int, ...]) -> None:
    n, space, exact, dp2, dp1, t6, t7, t2, mmm = row
    assert sample_space_size(5, n) == space
    assert count_unique_samples(5, n, "mean_sd") == exact
    assert count_unique_samples(5, n, "mean_sd", precision=2) == dp2
    assert count_unique_samples(5, n, "mean_sd", precision=1) == dp1
    assert count_unique_samples(5, n, "median_quartiles", quantile_type=6) == t6
    assert count_unique_samples(5, n, "median_quartiles", quantile_type=7) == t7
    assert count_unique_samples(5, n, "median_quartiles", quantile_type=2) == t2
    assert count_unique_samples(5, n, "median_min_max") == mmm


def _unique(keys: list[object]) -> int:
    return sum(1 for c in Counter(keys).values() if c == 1)


@pytest.mark.parametrize(("k", "n"), [(4, 7), (7, 5), (3, 9)])
def test_mean_sd_against_brute_force(k: int, n: int) -> None:
    xs = list(samples(1, k, n))
    assert len(xs) == sample_space_size(k, n) == math.comb(n + k - 1, n)
    exact_keys: list[object] = [(mean_of(x), variance_of(x)) for x in xs]
    assert count_unique_samples(k, n, "mean_sd") == _unique(exact_keys)
    for d in (0, 1, 2):
        keys: list[object] = [(round_dec(mean_of(x), d), round_sd(variance_of(x), d)) for x in xs]
        assert count_unique_samples(k, n, "mean_sd", precision=d) == _unique(keys)


@pytest.mark.parametrize("qtype", [1, 3, 5, 6, 7, 8, 9])
def test_quartiles_against_numpy(qtype: int) -> None:
    k, n = 6, 7
    keys: list[object] = [
        (median_of(x), quantile_of(x, 0.25, qtype), quantile_of(x, 0.75, qtype))
        for x in samples(1, k, n)
    ]
    assert count_unique_samples(k, n, "median_quartiles", quantile_type=qtype) == _unique(keys)


def test_sum_square_multiplicities_partition_the_sample_space() -> None:
    mult = sum_square_multiplicities(6, 5)
    brute = Counter((sum(x), sum(v * v for v in x)) for x in samples(1, 6, 5))
    assert mult == dict(brute)
    assert sum(mult.values()) == sample_space_size(6, 5)


def test_rounding_never_identifies_more_than_exact() -> None:
    for n in (5, 8):
        exact = count_unique_samples(6, n, "mean_sd")
        assert count_unique_samples(6, n, "mean_sd", precision=1) <= exact


def test_invalid_requests() -> None:
    with pytest.raises(ReconstructionError, match="quantile_type"):
        count_unique_samples(5, 5, "median_quartiles")
    with pytest.raises(ReconstructionError, match="precision"):
        count_unique_samples(5, 5, "median_min_max", precision=2)
    with pytest.raises(ReconstructionError, match="n >= 2"):
        count_unique_samples(5, 1, "mean_sd")
    with pytest.raises(ReconstructionError, match="unknown statistics"):
        count_unique_samples(5, 5, "mode")  # type: ignore[arg-type]
    with pytest.raises(ReconstructionError, match="at least one point"):
        sample_space_size(0, 3)
    with pytest.raises(ReconstructionError, match="limited"):
        count_unique_samples(30, 30, "median_min_max")
