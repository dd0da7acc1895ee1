"""Transformed Gaussian queries (Shoham & Rinott, "Asking the proper question", Theorems 1–2).

A vector query f(S) ∈ ℝᵏ whose components have per-component sensitivities ψ (ψᵢ = |fᵢ(S̃) −
fᵢ(S̃')| at the worst neighbouring pair, all components moving together, Lemma 1) is asked in the
form f_ξ(S) = Diag(ξ)^½ f(S) and answered as f_ξ(S) + N(0, σ²I).

Normalisation (ours, the paper's): ξ is scaled so that ψᵀDiag(ξ)ψ = ψᵀψ, i.e. the transformed
query has the same L2 sensitivity ‖ψ‖ as the plain one. The server therefore uses the same σ for
the same (ε, δ) and charges the ledger the same (‖ψ‖/σ)²; a transformation changes only where the
noise hurts the planned inference, never the privacy cost.

* goal "region" (Theorem 1): ξᵢ = (‖ψ‖²/k)/ψᵢ² minimises the volume of the standard χ² confidence
  ellipsoid for f(S); the volume ratio to the plain query is (GM(ψ²)/AM(ψ²))^{k/2}.
* goal "test" (Theorem 2): for H₀: f(S) = 0 against H₁: f(S) = η, all weight goes to the
  component j* maximising ηⱼ²/ψⱼ² (ξ_{j*} = ‖ψ‖²/ψ_{j*}², others 0); the likelihood-ratio test's
  power is Φ(√(Σξᵢηᵢ²)/σ − z_{1−α}).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field
from scipy import special, stats

from safeaccess.rules.dp.errors import DPParameterError, check_positive, check_probability

Goal = Literal["region", "test"]
_STD = NormalDist()
FloatArray = NDArray[np.float64]


def optimal_transform(psi: ArrayLike, goal: Goal, eta: ArrayLike | None = None) -> FloatArray:
    """ξ for the planned inference, normalised so that ψᵀDiag(ξ)ψ = ψᵀψ (same sensitivity).

    goal="region": ξᵢ = (‖ψ‖²/k)/ψᵢ² (minimum-volume confidence region).
    goal="test": ξ_{j*} = ‖ψ‖²/ψ_{j*}² at j* = argmax ηⱼ²/ψⱼ² (first on ties), 0 elsewhere
    (most powerful test of f(S) = 0 against f(S) = η).
    """
    p = _vector(psi, "psi")
    if np.any(p <= 0.0):
        raise DPParameterError("psi: every per-component sensitivity must be > 0")
    norm2 = float(np.dot(p, p))
    if goal == "region":
        if eta is not None:
            raise DPParameterError("eta is only used with goal='test'")
        return np.asarray((norm2 / p.size) / (p * p), dtype=np.float64)
    if goal == "test":
        if eta is None:
            raise DPParameterError("goal='test' needs the alternative eta")
        e = _vector(eta, "eta")
        if e.size != p.size:
            raise DPParameterError(f"eta has {e.size} components, psi has {p.size}")
        if not np.any(e != 0.0):
            raise DPParameterError("eta must differ from the null hypothesis 0 in some component")
        j = int(np.argmax((e * e) / (p * p)))
        xi = np.zeros(p.size, dtype=np.float64)
        xi[j] = norm2 / (p[j] * p[j])
        return xi
    raise DPParameterError(f"goal must be 'region' or 'test', got {goal!r}")


def transformed_sensitivity(psi: ArrayLike, xi: ArrayLike) -> float:
    """L2 sensitivity of Diag(ξ)^½ f: √(ψᵀDiag(ξ)ψ) (Lemma 1)."""
    p = _vector(psi, "psi")
    x = _weights(xi, p.size)
    return math.sqrt(float(np.dot(x, p * p)))


def transform_answer(values: ArrayLike, xi: ArrayLike) -> FloatArray:
    """The exact transformed query Diag(ξ)^½ f(S) that the server adds noise to."""
    v = _vector(values, "values")
    return np.sqrt(_weights(xi, v.size)) * v


class ConfidenceRegion(BaseModel):
    """Confidence ellipsoid {μ : Σ ξᵢ(μ̂ᵢ − μᵢ)²/σ² ≤ t} for f(S), with its bounding box."""

    model_config = ConfigDict(frozen=True)

    estimate: list[float] = Field(description="μ̂ = Diag(ξ)^-½ · answer")
    semi_axes: list[float] = Field(description="σ√t/√ξᵢ along coordinate i")
    level: float
    threshold: float = Field(description="t, the χ²_k quantile at the level")
    volume: float = Field(description="V_k (σ²t)^{k/2} Π ξᵢ^-½")
    box_lower: list[float] = Field(description="bounding box of the ellipsoid (coverage ≥ level)")
    box_upper: list[float]

    def contains(self, point: ArrayLike) -> bool:
        x = _vector(point, "point")
        est = np.asarray(self.estimate)
        axes = np.asarray(self.semi_axes)
        if x.size != est.size:
            raise DPParameterError(f"point has {x.size} components, the region {est.size}")
        return bool(np.sum(((x - est) / axes) ** 2) <= 1.0)


def confidence_region(
    answer: ArrayLike, xi: ArrayLike, sigma: float, level: float = 0.95
) -> ConfidenceRegion:
    """Invert a noisy transformed answer Diag(ξ)^½ f(S) + N(0, σ²I) into an estimate of f(S) and
    its confidence ellipsoid at `level` (every ξᵢ must be > 0)."""
    a = _vector(answer, "answer")
    x = _weights(xi, a.size)
    if np.any(x <= 0.0):
        raise DPParameterError("a confidence region needs xi > 0 in every component")
    sig = check_positive(sigma, "sigma")
    lvl = check_probability(level, "level")
    k = a.size
    t = _chi2_quantile(lvl, k)
    estimate = a / np.sqrt(x)
    axes = sig * math.sqrt(t) / np.sqrt(x)
    return ConfidenceRegion(
        estimate=estimate.tolist(),
        semi_axes=axes.tolist(),
        level=lvl,
        threshold=t,
        volume=region_volume(x, sig, lvl),
        box_lower=(estimate - axes).tolist(),
        box_upper=(estimate + axes).tolist(),
    )


def region_volume(xi: ArrayLike, sigma: float, level: float = 0.95) -> float:
    """Volume of the confidence ellipsoid: V_k (σ²t)^{k/2} (det Diag ξ)^-½ (Theorem 1, eq. 6)."""
    x = _weights(xi, None)
    if np.any(x <= 0.0):
        raise DPParameterError("a confidence region needs xi > 0 in every component")
    sig = check_positive(sigma, "sigma")
    k = x.size
    t = _chi2_quantile(check_probability(level, "level"), k)
    log_unit_ball = (k / 2.0) * math.log(math.pi) - float(special.gammaln(k / 2.0 + 1.0))
    log_volume = log_unit_ball + (k / 2.0) * math.log(sig * sig * t) - 0.5 * float(np.log(x).sum())
    return math.exp(log_volume)


def volume_ratio(psi: ArrayLike) -> float:
    """Vol(optimal region)/Vol(plain region) = (GM(ψ²)/AM(ψ²))^{k/2} ≤ 1."""
    p = _vector(psi, "psi")
    sq = p * p
    k = p.size
    return math.exp((k / 2.0) * (float(np.log(sq).mean()) - math.log(float(sq.mean()))))


class TestResult(BaseModel):
    """Likelihood-ratio test of f(S) = 0 against f(S) = η from a transformed answer."""

    model_config = ConfigDict(frozen=True)
    __test__ = False  # not a pytest class

    statistic: float = Field(description="z = answerᵀ ξ^½ η / (σ ‖ξ^½ η‖), N(0,1) under H₀")
    critical_value: float = Field(description="z_{1−α}")
    reject: bool
    alpha: float
    power: float = Field(description="power against η: Φ(‖ξ^½ η‖/σ − z_{1−α})")


def power(xi: ArrayLike, eta: ArrayLike, sigma: float, alpha: float = 0.05) -> float:
    """Power of the level-α likelihood-ratio test of 0 against η: 1 − Φ(z_{1−α} − √(ηᵀDiag(ξ)η)/σ)."""
    e = _vector(eta, "eta")
    x = _weights(xi, e.size)
    sig = check_positive(sigma, "sigma")
    a = check_probability(alpha, "alpha")
    shift = math.sqrt(float(np.dot(x, e * e))) / sig
    return _STD.cdf(shift - _STD.inv_cdf(1.0 - a))


def likelihood_ratio_test(
    answer: ArrayLike, xi: ArrayLike, eta: ArrayLike, sigma: float, alpha: float = 0.05
) -> TestResult:
    """Decide H₀: f(S) = 0 against H₁: f(S) = η from the noisy answer Diag(ξ)^½ f(S) + N(0, σ²I)."""
    a = _vector(answer, "answer")
    e = _vector(eta, "eta")
    if e.size != a.size:
        raise DPParameterError(f"eta has {e.size} components, the answer {a.size}")
    x = _weights(xi, a.size)
    sig = check_positive(sigma, "sigma")
    lvl = check_probability(alpha, "alpha")
    direction = np.sqrt(x) * e
    length = float(np.linalg.norm(direction))
    if length == 0.0:
        raise DPParameterError("the transformed query carries no information about eta")
    z = float(np.dot(a, direction)) / (sig * length)
    critical = _STD.inv_cdf(1.0 - lvl)
    return TestResult(
        statistic=z,
        critical_value=critical,
        reject=z > critical,
        alpha=lvl,
        power=power(x, e, sig, lvl),
    )


@lru_cache(maxsize=256)
def _chi2_quantile(level: float, k: int) -> float:
    return float(stats.chi2.ppf(level, k))


def _vector(values: ArrayLike | Sequence[float], name: str) -> FloatArray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise DPParameterError(f"{name} must be a vector of numbers") from None
    if arr.ndim != 1 or arr.size == 0:
        raise DPParameterError(f"{name} must be a non-empty vector, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise DPParameterError(f"{name} must contain only finite numbers")
    return arr


def _weights(xi: ArrayLike, size: int | None) -> FloatArray:
    x = _vector(xi, "xi")
    if size is not None and x.size != size:
        raise DPParameterError(f"xi has {x.size} components, expected {size}")
    if np.any(x < 0.0):
        raise DPParameterError("xi must be >= 0 in every component")
    return x
