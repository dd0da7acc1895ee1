"""Counting samples consistent with released statistics, against brute-force enumeration."""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_reconstruction_oracle import (
    frequency_bounds,
    matching,
    mean_of,
    quantile_of,
    round_dec,
    round_sd,
    variance_of,
)

from safeaccess.rules.reconstruction import (
    Admissible,
    BudgetExceeded,
    OrderConstraint,
    ReconstructionError,
    SampleConstraints,
    analyse,
    count_consistent,
    count_matching_samples,
    exists_consistent,
    matching_frequency_bounds,
    quantile_weights,
)
from safeaccess.rules.reconstruction._exact import median_weights


def _released_mean_sd(x: tuple[int, ...], d: int) -> tuple[Decimal, Decimal]:
    return round_dec(mean_of(x), d), round_sd(variance_of(x), d)


@st.composite
def sample_and_precision(draw: st.DrawFn) -> tuple[int, tuple[int, ...], int]:
    k = draw(st.integers(2, 6))
    n = draw(st.integers(2, 9))
    x = tuple(sorted(draw(st.lists(st.integers(1, k), min_size=n, max_size=n))))
    return k, x, draw(st.integers(0, 2))


@settings(max_examples=60, deadline=None)
@given(sample_and_precision())
def test_count_and_bounds_match_brute_force(case: tuple[int, tuple[int, ...], int]) -> None:
    k, x, d = case
    n = len(x)
    mean, sd = _released_mean_sd(x, d)
    found = matching(1, k, n, lambda y: _released_mean_sd(y, d) == (mean, sd))
    assert x in found
    assert count_matching_samples(k, n, mean, sd, d) == len(found)
    assert matching_frequency_bounds(k, n, mean, sd, d) == frequency_bounds(found, 1, k)


def test_unrounded_release_identifies_the_exact_key() -> None:
    x = (1, 2, 2, 3, 4)  # the paper's example: unique on a 5-point scale
    mean, var = mean_of(x), variance_of(x)
    sd = math.sqrt(var)
    exact = matching(1, 5, 5, lambda y: (mean_of(y), variance_of(y)) == (mean, var))
    assert exact == [x]
    assert count_matching_samples(5, 5, float(mean), sd, None) == 1


@pytest.mark.parametrize(
    ("n", "mean", "sd", "solutions"),
    [
        # Derrick et al., section 1 (4-point health scale, males by ethnicity): the number of
        # frequency distributions the paper reports for each group.
        (6, "2.67", "0.816", 2),
        (8, "2.00", "0.926", 2),
        (18, "2.06", "0.998", 4),
        (5, "2.00", "0.000", 1),
    ],
)
def test_papers_health_survey_example(n: int, mean: str, sd: str, solutions: int) -> None:
    cons = SampleConstraints(
        low=1,
        high=4,
        n=n,
        means=(Admissible.released(mean, 2, ties="half_even"),),
        sds=(Admissible.released(sd, 3, ties="half_even"),),
    )
    assert count_consistent(cons) == solutions
    brute = matching(
        1,
        4,
        n,
        lambda y: (
            round_dec(mean_of(y), 2) == Decimal(mean) and round_sd(variance_of(y), 3) == Decimal(sd)
        ),
    )
    assert len(brute) == solutions


def test_asian_group_bounds_pin_nothing_but_black_group_is_unique() -> None:
    # {1,3,3,3,3,3} or {2,2,2,3,3,4}: every count varies between the two.
    cons = SampleConstraints(
        1, 4, 6, (Admissible.released("2.67", 2),), (Admissible.released("0.816", 3),)
    )
    result = analyse(cons)
    assert result.count == 2
    assert result.bounds == {1: (0, 1), 2: (0, 3), 3: (2, 5), 4: (0, 1)}
    assert result.pinned() == {}
    black = SampleConstraints(
        1, 4, 5, (Admissible.released("2.00", 2),), (Admissible.released("0.000", 3),)
    )
    assert analyse(black).pinned() == {1: 0, 2: 5, 3: 0, 4: 0}


@st.composite
def order_case(draw: st.DrawFn) -> tuple[int, tuple[int, ...], int, list[str], int | None]:
    k = draw(st.integers(2, 6))
    n = draw(st.integers(1, 9))
    x = tuple(sorted(draw(st.lists(st.integers(1, k), min_size=n, max_size=n))))
    qtype = draw(st.integers(1, 9))
    stats = draw(
        st.lists(
            st.sampled_from(["median", "q0.25", "q0.75", "min", "max", "mean", "sd"]),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    if n < 2 and "sd" in stats:
        stats.remove("sd")
    d = draw(st.sampled_from([None, 0, 1]))
    return qtype, x, k, stats or ["median"], d


def _stat(name: str, x: tuple[int, ...], qtype: int) -> Fraction:
    if name == "median":
        return quantile_of(x, 0.5, 2)
    if name in ("q0.25", "q0.75"):
        return quantile_of(x, float(name[1:]), qtype)
    if name == "min":
        return Fraction(x[0])
    if name == "max":
        return Fraction(x[-1])
    if name == "mean":
        return mean_of(x)
    raise AssertionError(name)


def _released(name: str, x: tuple[int, ...], qtype: int, d: int | None) -> object:
    if name == "sd":
        var = variance_of(x)
        return var if d is None else round_sd(var, d)
    value = _stat(name, x, qtype)
    return value if d is None else round_dec(value, d)


@settings(max_examples=60, deadline=None)
@given(order_case())
def test_mixed_statistics_match_brute_force(
    case: tuple[int, tuple[int, ...], int, list[str], int | None],
) -> None:
    qtype, x, k, stats, d = case
    n = len(x)
    released = {s: _released(s, x, qtype, d) for s in stats}
    found = matching(
        1, k, n, lambda y: all(_released(s, y, qtype, d) == v for s, v in released.items())
    )

    def adm(value: object) -> Admissible:
        if d is None:
            return Admissible.exactly(value)  # type: ignore[arg-type]
        return Admissible.released(value, d, ties="half_even")  # type: ignore[arg-type]

    order = []
    for s in stats:
        if s == "median":
            order.append(OrderConstraint(s, median_weights(n), adm(released[s])))
        elif s == "min":
            order.append(OrderConstraint(s, ((1, Fraction(1)),), adm(released[s])))
        elif s == "max":
            order.append(OrderConstraint(s, ((n, Fraction(1)),), adm(released[s])))
        elif s.startswith("q"):
            weights = quantile_weights(n, Fraction(s[1:]), qtype)
            order.append(OrderConstraint(s, weights, adm(released[s])))
    means = (adm(released["mean"]),) if "mean" in stats else ()
    sds: tuple[Admissible, ...] = ()
    variances: tuple[Admissible, ...] = ()
    if "sd" in stats:
        if d is None:
            variances = (Admissible.exactly(released["sd"]),)  # type: ignore[arg-type]
        else:
            sds = (adm(released["sd"]),)
    cons = SampleConstraints(1, k, n, means, sds, variances, tuple(order))
    result = analyse(cons)
    assert result.count == len(found)
    assert count_consistent(cons) == len(found)
    assert result.bounds == frequency_bounds(found, 1, k)
    assert all(cons.admits(Counter(y)) for y in found)
    # searches: is there a fitting sample with at most one record at the top value?
    assert exists_consistent(cons, {k: (0, 1)}) == any(y.count(k) <= 1 for y in found)


def test_searches_find_alternatives_and_respect_bounds() -> None:
    cons = SampleConstraints(
        1, 4, 6, (Admissible.released("2.67", 2),), (Admissible.released("0.816", 3),)
    )
    assert exists_consistent(cons, {1: (1, 1)})  # {1,3,3,3,3,3}
    assert exists_consistent(cons, {4: (1, 6)})  # {2,2,2,3,3,4}
    assert not exists_consistent(cons, {3: (3, 4)})  # 3 occurs 5 or 2 times


def test_large_sample_is_counted_exactly() -> None:
    # n = 60 on a 5-point scale: cross-check the count against a second, independent
    # computation -- sum over the admissible (sum, sum of squares) keys of their
    # multiplicities from a plain DP over values.
    from safeaccess.rules.reconstruction.samples import sum_square_multiplicities

    n, mean, sd = 60, "3.10", "1.20"
    mult = sum_square_multiplicities(5, n)
    expected = sum(
        ways
        for (s, q), ways in mult.items()
        if round_dec(Fraction(s, n), 2) == Decimal(mean)
        and round_sd(Fraction(n * q - s * s, n * (n - 1)), 2) == Decimal(sd)
    )
    assert expected > 100
    assert count_matching_samples(5, n, mean, sd, 2) == expected


def test_budget_is_enforced() -> None:
    # per-value bounds by the dynamic programme (matching_frequency_bounds may count instead)
    moments = SampleConstraints(
        1,
        10,
        200,
        means=(Admissible.released("5.60", 2, ties="half_even"),),
        sds=(Admissible.released("2.40", 2, ties="half_even"),),
    )
    with pytest.raises(BudgetExceeded):
        analyse(moments, max_steps=1000)
    # a median brings order statistics in: only the general programme applies, and it stops
    cons = SampleConstraints(
        1,
        10,
        300,
        means=(Admissible.released("5.44", 2),),
        sds=(Admissible.released("2.85", 2),),
        order=(OrderConstraint("median", median_weights(300), Admissible.released("5.5", 1)),),
    )
    with pytest.raises(BudgetExceeded):
        count_consistent(cons, max_steps=1000)


def _dp_and_pivot(k: int, x: list[int], d: int) -> tuple[int | None, int | None]:
    from safeaccess.rules.reconstruction.matching import _mean_sd_constraints, _Solver
    from safeaccess.rules.reconstruction.pivot import count_targets

    n = len(x)
    mean, sd = _released_mean_sd(tuple(sorted(x)), d)
    solver = _Solver(_mean_sd_constraints(k, n, mean, sd, d), 300_000, None)
    try:
        dp = sum(solver.count(fr, 0, n, t, u) for fr, t, u in solver.roots())
    except BudgetExceeded:
        dp = None
    pairs = [(t + n, u + 2 * (t + n) - n) for t, u in solver.targets]  # back to values 1..k
    return dp, count_targets(1, k, n, pairs)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(4, 9),
    st.integers(2, 120),
    st.floats(0.3, 3.0),
    st.integers(0, 2),
    st.randoms(use_true_random=False),
)
def test_pivot_method_agrees_with_the_dynamic_programme(
    k: int, n: int, spread: float, d: int, rnd: object
) -> None:
    centre = rnd.uniform(1, k)  # type: ignore[attr-defined]
    x = [min(k, max(1, round(rnd.gauss(centre, spread)))) for _ in range(n)]  # type: ignore[attr-defined]
    dp, pivot = _dp_and_pivot(k, x, d)
    if dp is not None and pivot is not None:
        assert pivot == dp


def test_pivot_method_on_a_thousand_records() -> None:
    # k = 7, n = 1000, mean 4.29, SD 1.22 (2 dp). The expected count was computed once by the
    # general dynamic programme in this package (about ten minutes), an independent method.
    assert count_matching_samples(7, 1000, "4.29", "1.22", 2) == 9869814256


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ReconstructionError, match="decimal"):
        count_matching_samples(5, 10, "3.123", "1.0", 2)
    with pytest.raises(ReconstructionError, match="n >= 2"):
        count_matching_samples(5, 1, "3", "0", 0)
    with pytest.raises(ReconstructionError, match="at least one point"):
        count_matching_samples(0, 10, "3", "1", 0)
    with pytest.raises(ReconstructionError, match="different samples"):
        SampleConstraints(1, 5, 10).merged(SampleConstraints(1, 5, 11))
    assert count_matching_samples(5, 10, "9.00", "1.00", 2) == 0  # mean off the scale
