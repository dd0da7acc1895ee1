"""Exact arithmetic for released statistics: rounding, square roots and sample quantiles.

Everything here works on `fractions.Fraction` so that a statistic computed from a candidate
sample is compared with a released value without any floating-point error (Derrick et al.'s
published "full precision" counts are off precisely because floats were compared with `==`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Literal

Number = int | float | str | Decimal | Fraction
Ties = Literal["half_even", "either"]

_HALF = Fraction(1, 2)
_QUARTER = Fraction(1, 4)

# Relative width of the interval accepted around a statistic released without rounding. A
# float carries ~1e-16 relative error; distinct candidate values of a mean or SD of integers
# differ by far more than 1e-9 for any n below a million, so this identifies the exact value.
EXACT_RELATIVE_TOLERANCE = Fraction(1, 10**9)


class ReconstructionError(ValueError):
    """Input to a reconstruction-risk computation is not usable; the message says why."""


def to_fraction(value: Number) -> Fraction:
    """The exact rational a released number denotes (a float by its shortest decimal form)."""
    if isinstance(value, bool):
        raise ReconstructionError(f"expected a number, got the boolean {value!r}")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ReconstructionError(f"released value {value!r} is not a finite number")
        # repr gives the shortest decimal that round-trips: the value the researcher sees.
        return Fraction(Decimal(repr(value)))
    try:
        dec = Decimal(value)
    except InvalidOperation as exc:
        raise ReconstructionError(f"{value!r} is not a number") from exc
    if not dec.is_finite():
        raise ReconstructionError(f"released value {value!r} is not a finite number")
    return Fraction(dec)


def round_half_even(x: Fraction, decimals: int) -> Fraction:
    """Round an exact rational to `decimals` places, ties to even (R's and numpy's rule)."""
    scale = 10**decimals
    scaled = x * scale
    floor = scaled.numerator // scaled.denominator
    rest = scaled - floor
    if rest > _HALF or (rest == _HALF and floor % 2 == 1):
        floor += 1
    return Fraction(floor, scale)


def round_sqrt_half_even(v: Fraction, decimals: int) -> Fraction:
    """Round sqrt(v) (v >= 0 rational) to `decimals` places, ties to even, exactly.

    With t = v * 10^(2d) and m = floor(sqrt(t)) = isqrt(floor(t)), sqrt(t) rounds up exactly
    when t > (m + 1/2)^2, i.e. t > m^2 + m + 1/4; equality is a tie.
    """
    if v < 0:
        raise ReconstructionError("a variance cannot be negative")
    scale = 10**decimals
    t = v * scale * scale
    m = math.isqrt(t.numerator // t.denominator)
    boundary = Fraction(m * m + m) + _QUARTER
    if t > boundary or (t == boundary and m % 2 == 1):
        m += 1
    return Fraction(m, scale)


@dataclass(frozen=True)
class Admissible:
    """The exact values that a released statistic could have come from.

    `lo`/`hi` bound the set (closed). With `decimals` set, the statistic was rounded: under
    `ties="half_even"` exactly the values that round half-to-even to `value` are admitted; under
    `ties="either"` the whole closed interval [value - h, value + h] is, because a runner that
    rounds a floating-point result may resolve an exact tie either way.
    """

    value: Fraction
    lo: Fraction
    hi: Fraction
    decimals: int | None
    ties: Ties

    @classmethod
    def released(cls, value: Number, decimals: int | None, ties: Ties = "either") -> Admissible:
        """Admissible set of a value released with `decimals` places (None: unrounded float)."""
        v = to_fraction(value)
        if decimals is None:
            tol = EXACT_RELATIVE_TOLERANCE * max(Fraction(1), abs(v))
            return cls(v, v - tol, v + tol, None, "either")
        if decimals < 0:
            raise ReconstructionError(f"decimals must be >= 0, got {decimals}")
        if round_half_even(v, decimals) != v:
            raise ReconstructionError(
                f"released value {value!r} has more than {decimals} decimal places"
            )
        half = Fraction(1, 2 * 10**decimals)
        return cls(v, v - half, v + half, decimals, ties)

    @classmethod
    def exactly(cls, value: Number) -> Admissible:
        """Only the exact rational `value` itself."""
        v = to_fraction(value)
        return cls(v, v, v, None, "either")

    def contains(self, x: Fraction) -> bool:
        """Could the statistic's exact value have been `x`?"""
        if self.decimals is not None and self.ties == "half_even":
            return round_half_even(x, self.decimals) == self.value
        return self.lo <= x <= self.hi

    def contains_sqrt(self, v: Fraction) -> bool:
        """Could the statistic (a standard deviation) have been sqrt(v)?"""
        if v < 0:
            return False
        if self.decimals is not None and self.ties == "half_even":
            return round_sqrt_half_even(v, self.decimals) == self.value
        lo = max(self.lo, Fraction(0))
        return lo * lo <= v <= self.hi * self.hi if self.hi >= 0 else False


QuantileWeights = tuple[tuple[int, Fraction], ...]

# Hyndman & Fan (1996) continuous types 4-9: position a + p (n + 1 - a - b).
_HF_AB: dict[int, tuple[Fraction, Fraction]] = {
    4: (Fraction(0), Fraction(1)),
    5: (_HALF, _HALF),
    6: (Fraction(0), Fraction(0)),
    7: (Fraction(1), Fraction(1)),
    8: (Fraction(1, 3), Fraction(1, 3)),
    9: (Fraction(3, 8), Fraction(3, 8)),
}


def quantile_weights(n: int, p: Fraction, qtype: int) -> QuantileWeights:
    """Sample quantile of type `qtype` as weights on order statistics (1-based positions).

    The quantile of a sorted sample x_(1) <= ... <= x_(n) is sum(w * x_(i)). This is the
    definition of R's `quantile(type=...)`: (1 - h) x_(j) + h x_(j+1) with x_(0) = x_(1) and
    x_(n+1) = x_(n), where j and h depend on the type.
    """
    if n < 1:
        raise ReconstructionError("a quantile needs at least one observation")
    if not 0 <= p <= 1:
        raise ReconstructionError(f"quantile probability {p} must lie in [0, 1]")
    if qtype in (1, 2):
        np_ = n * p
        j = math.floor(np_)
        if qtype == 1:
            h = Fraction(1) if np_ > j else Fraction(0)
        else:
            h = Fraction(1) if np_ > j else _HALF
    elif qtype == 3:
        np_ = n * p - _HALF
        j = math.floor(np_)
        h = Fraction(1) if (np_ != j or j % 2 == 1) else Fraction(0)
    elif qtype in _HF_AB:
        a, b = _HF_AB[qtype]
        pos = a + p * (n + 1 - a - b)
        j = math.floor(pos)
        h = pos - j
    else:
        raise ReconstructionError(f"unknown Hyndman-Fan quantile type {qtype}; use 1 to 9")
    weights: dict[int, Fraction] = {}
    for position, w in ((j, 1 - h), (j + 1, h)):
        if w == 0:
            continue
        clamped = min(max(position, 1), n)
        weights[clamped] = weights.get(clamped, Fraction(0)) + w
    return tuple(sorted(weights.items()))


def median_weights(n: int) -> QuantileWeights:
    """The usual median: the middle value, or the midpoint of the two middle values."""
    if n < 1:
        raise ReconstructionError("a median needs at least one observation")
    if n % 2 == 1:
        return (((n + 1) // 2, Fraction(1)),)
    return ((n // 2, _HALF), (n // 2 + 1, _HALF))


def weighted_order_statistic(sorted_values: tuple[int, ...], weights: QuantileWeights) -> Fraction:
    """Evaluate sum(w * x_(i)) on a sorted sample."""
    return sum((w * sorted_values[i - 1] for i, w in weights), Fraction(0))


QUANTILE_WINDOW = 10
"""Order statistics averaged into every released quantile (the DwB threshold of 10)."""


def window_weights(n: int, centre: Fraction, window: int = QUANTILE_WINDOW) -> QuantileWeights:
    """Equal weights on the `window` consecutive order statistics nearest `centre` (1-based).

    The window [j, j + m - 1], m = min(window, n), is centred on the position (ties of the
    rounding go up) and slid inside 1..n at the ends, so a released quantile is always the
    mean of m records and never one record's value once n >= window.
    """
    if n < 1:
        raise ReconstructionError("a quantile needs at least one observation")
    m = min(window, n)
    start = math.floor(centre - Fraction(m - 1, 2) + _HALF)
    start = min(max(start, 1), n - m + 1)
    return tuple((i, Fraction(1, m)) for i in range(start, start + m))


def windowed_quantile_weights(
    n: int, p: Fraction, qtype: int, window: int = QUANTILE_WINDOW
) -> QuantileWeights:
    """The released quantile p: the mean of the `window` order statistics nearest the
    position that Hyndman-Fan type `qtype` gives it (the weighted centre of its weights)."""
    centre = sum((i * w for i, w in quantile_weights(n, p, qtype)), Fraction(0))
    return window_weights(n, centre, window)


def windowed_median_weights(n: int, window: int = QUANTILE_WINDOW) -> QuantileWeights:
    """The released median: the mean of the `window` order statistics around (n + 1) / 2."""
    return window_weights(n, Fraction(n + 1, 2), window)
