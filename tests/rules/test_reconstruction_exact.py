"""Exact rounding and quantile helpers against independent references (decimal, numpy)."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_reconstruction_oracle import quantile_of, round_dec, round_sd

from safeaccess.rules.reconstruction import (
    Admissible,
    ReconstructionError,
    quantile_weights,
    round_half_even,
    round_sqrt_half_even,
)
from safeaccess.rules.reconstruction._exact import median_weights, to_fraction

fractions = st.fractions(min_value=0, max_value=100, max_denominator=400)


@settings(max_examples=300, deadline=None)
@given(fractions, st.integers(0, 4))
def test_round_half_even_matches_decimal(x: Fraction, d: int) -> None:
    assert round_half_even(x, d) == Fraction(round_dec(x, d))


@settings(max_examples=300, deadline=None)
@given(fractions, st.integers(0, 4))
def test_round_sqrt_matches_decimal_sqrt(v: Fraction, d: int) -> None:
    assert round_sqrt_half_even(v, d) == Fraction(round_sd(v, d))


def test_exact_ties_round_to_even() -> None:
    assert round_half_even(Fraction(5, 2), 0) == 2
    assert round_half_even(Fraction(7, 2), 0) == 4
    assert round_sqrt_half_even(Fraction(1, 64), 2) == Fraction(12, 100)  # sqrt = 0.125
    assert round_sqrt_half_even(Fraction(225, 10000), 2) == Fraction(15, 100)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 7), min_size=1, max_size=15),
    st.sampled_from([0.1, 0.25, 0.5, 0.75, 0.9, 0.33]),
    st.integers(1, 9),
)
def test_quantile_weights_match_numpy(values: list[int], p: float, qtype: int) -> None:
    x = tuple(sorted(values))
    weights = quantile_weights(len(x), Fraction(str(p)), qtype)
    assert sum(w for _, w in weights) == 1
    ours = sum((w * x[i - 1] for i, w in weights), Fraction(0))
    assert ours == quantile_of(x, p, qtype)


def test_median_weights() -> None:
    assert median_weights(5) == ((3, Fraction(1)),)
    assert median_weights(4) == ((2, Fraction(1, 2)), (3, Fraction(1, 2)))


def test_released_value_parsing() -> None:
    assert to_fraction(2.06) == Fraction(206, 100)
    assert to_fraction("0.816") == Fraction(816, 1000)
    adm = Admissible.released(2.06, 2)
    assert adm.contains(Fraction(2055, 1000)) and adm.contains(Fraction(2065, 1000))
    assert not adm.contains(Fraction(2066, 1000))
    # 2.065 lies exactly between 2.06 and 2.07: half-to-even gives 2.06, so a strict reading
    # of a released 2.07 excludes it, while the tolerant reading (a runner rounding a float
    # may have gone either way) admits it.
    assert not Admissible.released(2.07, 2, ties="half_even").contains(Fraction(2065, 1000))
    assert Admissible.released(2.07, 2, ties="either").contains(Fraction(2065, 1000))
    assert Admissible.released(2.06, 2, ties="half_even").contains(Fraction(2065, 1000))


def test_bad_input_is_rejected_with_a_reason() -> None:
    with pytest.raises(ReconstructionError, match="more than 2 decimal"):
        Admissible.released(2.061, 2)
    with pytest.raises(ReconstructionError, match="not a number"):
        to_fraction("abc")
    with pytest.raises(ReconstructionError, match="finite"):
        to_fraction(float("nan"))
    with pytest.raises(ReconstructionError, match="type"):
        quantile_weights(5, Fraction(1, 4), 10)
    assert to_fraction(Decimal("1.5")) == Fraction(3, 2)
