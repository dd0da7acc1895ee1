"""Nested pivot shells (`shells.py`) against brute force, the dynamic programme, and itself
under a different choice of first pivots (a different set of tables and inclusion-exclusion
terms for the same number)."""

from __future__ import annotations

import math
import random
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_reconstruction_oracle import (
    frequency_bounds,
    matching,
    mean_of,
    round_dec,
    round_sd,
    variance_of,
)

from safeaccess.rules.reconstruction import (
    Admissible,
    BudgetExceeded,
    SampleConstraints,
    analyse,
    count_consistent,
    count_matching_samples,
)
from safeaccess.rules.reconstruction.matching import (
    _bounds_by_counting,
    _mean_sd_constraints,
    _Solver,
)
from safeaccess.rules.reconstruction.shells import (
    PRIMES,
    _bound,
    _count_groups,
    count_targets_shells,
    multisets_by_sum,
)


def _released(x: list[int] | tuple[int, ...], d: int) -> tuple[Decimal, Decimal]:
    x = tuple(sorted(x))
    return round_dec(mean_of(x), d), round_sd(variance_of(x), d)


def _targets(k: int, n: int, mean: Decimal, sd: Decimal, d: int) -> tuple[_Solver, list]:
    solver = _Solver(_mean_sd_constraints(k, n, mean, sd, d), 400_000, None)
    # the solver works on values shifted to 0..k-1; back to 1..k
    pairs = [(t + n, u + 2 * (t + n) - n) for t, u in solver.targets]
    return solver, pairs


def _with_first_pivot(k: int, n: int, a: int, pairs: list[tuple[int, int]]) -> int | None:
    return _count_groups(1, k, n, {a: [p for p in pairs if n * p[1] >= p[0] ** 2]})


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(2, 8), st.integers(0, 2), st.randoms(use_true_random=False))
def test_shells_match_brute_force(k: int, n: int, d: int, rnd: random.Random) -> None:
    x = [rnd.randint(1, k) for _ in range(n)]
    mean, sd = _released(x, d)
    found = matching(1, k, n, lambda y: _released(y, d) == (mean, sd))
    _, pairs = _targets(k, n, mean, sd, d)
    assert count_targets_shells(1, k, n, pairs) == len(found)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(4, 10),
    st.integers(2, 70),
    st.floats(0.3, 6.0),
    st.integers(0, 2),
    st.randoms(use_true_random=False),
)
def test_shells_agree_with_the_dynamic_programme(
    k: int, n: int, spread: float, d: int, rnd: random.Random
) -> None:
    # spreads up to 6 on a 10-point scale: near-uniform data, where several shells are non-empty
    centre = rnd.uniform(1, k)
    x = [min(k, max(1, round(rnd.gauss(centre, spread)))) for _ in range(n)]
    mean, sd = _released(x, d)
    solver, pairs = _targets(k, n, mean, sd, d)
    try:
        dp = sum(solver.count(fr, 0, n, t, u) for fr, t, u in solver.roots())
    except BudgetExceeded:
        return
    assert dp >= 1  # the true sample is one of them
    assert count_targets_shells(1, k, n, pairs) == dp


def test_uniform_sample_counted_by_both_methods() -> None:
    # evenly spread over 1..10: the DP needs ~6 million steps here, shells a few tables
    x = [int(v) for v in random.Random(7).choices(range(1, 11), k=60)]
    mean, sd = _released(x, 2)
    solver, _ = _targets(10, 60, mean, sd, 2)
    solver.max_steps = 50_000_000
    dp = sum(solver.count(fr, 0, 60, t, u) for fr, t, u in solver.roots())
    assert dp > 1000
    assert count_matching_samples(10, 60, mean, sd, 2) == dp


@pytest.mark.parametrize(
    ("k", "n", "mean", "sd", "pivots"),
    [
        (7, 1000, "4.01", "2.01", (2, 3, 4, 5)),  # uniform-like on 1..7
        (10, 300, "5.44", "2.85", (3, 5, 7)),  # uniform-like on 1..10
        (10, 1000, "5.87", "1.52", (5, 6)),  # Likert-like
    ],
)
def test_count_does_not_depend_on_the_first_pivots(
    k: int, n: int, mean: str, sd: str, pivots: tuple[int, ...]
) -> None:
    _, pairs = _targets(k, n, Decimal(mean), Decimal(sd), 2)
    counts = {_with_first_pivot(k, n, a, pairs) for a in pivots}
    assert len(counts) == 1
    (count,) = counts
    assert count is not None and count > 10**6
    assert count_matching_samples(k, n, mean, sd, 2) == count


def test_agrees_with_the_pivot_method_on_a_thousand_records() -> None:
    # value computed by the general dynamic programme (see test_reconstruction_matching)
    assert count_matching_samples(7, 1000, "4.29", "1.22", 2) == 9869814256


def test_impossible_targets_count_zero() -> None:
    # mean 1.00 with a positive SD cannot happen on 1..5; variance < 0 targets are skipped
    assert count_matching_samples(5, 50, "1.00", "0.50", 2) == 0
    assert count_targets_shells(1, 5, 10, [(30, 80)]) == 0  # n Q < S^2


def test_moduli_are_distinct_primes() -> None:
    # trial division: independent of the code under test
    assert len(set(PRIMES)) == len(PRIMES)
    for p in PRIMES:
        assert all(p % f for f in range(2, math.isqrt(p) + 1)), p


def test_multisets_by_sum_against_a_direct_count() -> None:
    # multisets of 30 values on 0..9 by sum, by a DP over values with Python integers
    ways = [[1] + [0] * 270] + [[0] * 271 for _ in range(30)]  # ways[m][s]
    for v in range(10):
        for m in range(1, 31):
            for s in range(v, 271):
                ways[m][s] += ways[m - 1][s - v]
    assert list(multisets_by_sum(30, 9)) == ways[30]
    assert sum(multisets_by_sum(1000, 9)) == math.comb(1009, 9)
    # above 2^64 the bound on the answer is the multisets with the released sums, below it
    # the whole sample space
    assert _bound(1, 10, 1000, {5580}) == multisets_by_sum(1000, 9)[4580] < math.comb(1009, 9)
    assert _bound(1, 10, 30, {150}) == math.comb(39, 9)


@settings(max_examples=15, deadline=None)
@given(
    st.integers(3, 8), st.integers(2, 40), st.floats(0.5, 4.0), st.randoms(use_true_random=False)
)
def test_frequency_bounds_by_counting_agree_with_the_dynamic_programme(
    k: int, n: int, spread: float, rnd: random.Random
) -> None:
    centre = rnd.uniform(1, k)
    x = [min(k, max(1, round(rnd.gauss(centre, spread)))) for _ in range(n)]
    mean, sd = _released(x, 2)
    cons = _mean_sd_constraints(k, n, mean, sd, 2)
    try:
        expected = analyse(cons, max_steps=400_000).bounds
    except BudgetExceeded:
        return
    assert all(lo <= x.count(v) <= hi for v, (lo, hi) in expected.items())
    assert _bounds_by_counting(cons) == expected


@pytest.mark.parametrize(("low", "high"), [(0, 4), (-2, 3), (3, 9)])
def test_scales_not_starting_at_one(low: int, high: int) -> None:
    rnd = random.Random(low * 100 + high)
    n = 7
    x = [rnd.randint(low, high) for _ in range(n)]
    mean, sd = _released(x, 1)
    cons = SampleConstraints(
        low,
        high,
        n,
        means=(Admissible.released(mean, 1, ties="half_even"),),
        sds=(Admissible.released(sd, 1, ties="half_even"),),
    )
    found = matching(low, high, n, lambda y: _released(y, 1) == (mean, sd))
    assert tuple(sorted(x)) in found
    assert count_consistent(cons) == len(found)
    assert _bounds_by_counting(cons) == frequency_bounds(found, low, high)
