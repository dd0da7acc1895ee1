"""Analytic calibration of the Gaussian mechanism (Balle & Wang 2018; Shoham & Rinott, Lemma 2).

A Gaussian mechanism that adds N(0, σ²I) to a query of L2 sensitivity Δ is (ε, δ)-DP exactly when

    Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ) ≤ δ.

The left-hand side depends on σ and Δ only through s = σ/Δ (equivalently μ = Δ/σ), and it is
strictly decreasing in s and in ε. Everything here is scalar and pure Python: it is evaluated on
the server for every release and must not pull numerical libraries into small callers.

Numerics: e^ε Φ(B) is formed as exp(ε + log Φ(B)) and the difference as
Φ(A)·(−expm1(ε + log Φ(B) − log Φ(A))), with log Φ computed from erfc (and its asymptotic
series far in the tail), so neither overflows at large ε nor cancels catastrophically at small δ.
Every solve is a bisection on floating-point numbers that ends with two adjacent candidates; the
one returned is always the one on the safe side (the inequality holds for it as evaluated here).
"""

from __future__ import annotations

import math

from safeaccess.rules.dp.errors import (
    check_delta,
    check_epsilon,
    check_non_negative,
    check_positive,
)

_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def log_ndtr(x: float) -> float:
    """log Φ(x), accurate in both tails."""
    if x > 0.0:
        # Φ(x) = 1 − Φ(−x); log1p keeps the tiny complement.
        return math.log1p(-0.5 * math.erfc(x / _SQRT2))
    if x > -30.0:
        return math.log(0.5 * math.erfc(-x / _SQRT2))
    # Mills-ratio series: Φ(x) = φ(x)/|x| · (1 − 1/x² + 3/x⁴ − 15/x⁶ + 105/x⁸ ...), |x| ≥ 30.
    z = 1.0 / (x * x)
    series = 1.0 - z * (1.0 - 3.0 * z * (1.0 - 5.0 * z * (1.0 - 7.0 * z)))
    return -0.5 * x * x - math.log(-x) - _LOG_SQRT_2PI + math.log(series)


def gaussian_delta_for(epsilon: float, noise_ratio: float) -> float:
    """The smallest δ for which noise of σ = noise_ratio·Δ is (ε, δ)-DP (its privacy profile).

    `noise_ratio` is σ/Δ (= 1/μ); ε ≥ 0 is allowed here (ε = 0 gives the total variation).
    """
    eps = check_non_negative(epsilon, "epsilon")
    s = check_positive(noise_ratio, "noise_ratio (sigma / sensitivity)")
    return _delta(eps, s)


def _delta(eps: float, s: float) -> float:
    a = 0.5 / s - eps * s
    b = -0.5 / s - eps * s
    log_a = log_ndtr(a)
    gap = eps + log_ndtr(b) - log_a
    if gap >= 0.0:
        return 0.0
    return math.exp(log_a) * -math.expm1(gap)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest σ such that N(0, σ²) noise on a query of L2 sensitivity Δ is (ε, δ)-DP.

    Valid for any ε > 0 and δ in (0, 1). The result is rounded up to the next floating-point value
    for which the defining inequality holds, never down.
    """
    eps = check_epsilon(epsilon)
    target = check_delta(delta)
    sens = check_positive(sensitivity, "sensitivity")
    ratio = _smallest_ratio(eps, target)
    sigma = ratio * sens
    # The product may round below the exact ratio·Δ: step up until the check holds for σ/Δ.
    while _delta(eps, sigma / sens) > target:
        sigma = math.nextafter(sigma, math.inf)
    return sigma


def _smallest_ratio(eps: float, target: float) -> float:
    """Smallest s = σ/Δ with δ(ε, s) ≤ target, by bisection on log s down to adjacent floats."""
    lo, hi = 1.0, 1.0
    if _delta(eps, 1.0) > target:
        while _delta(eps, hi) > target:
            lo, hi = hi, hi * 2.0
    else:
        while _delta(eps, lo) <= target:
            lo, hi = lo / 2.0, lo
            if lo < 1e-300:  # pragma: no cover - δ < 1 is always reached well before this
                raise ArithmeticError("analytic Gaussian calibration did not bracket")
    # Invariant: δ(lo) > target ≥ δ(hi).
    while True:
        mid = math.sqrt(lo * hi)
        if not (lo < mid < hi):
            mid = lo + (hi - lo) / 2.0
            if not (lo < mid < hi):
                return hi
        if _delta(eps, mid) > target:
            lo = mid
        else:
            hi = mid
