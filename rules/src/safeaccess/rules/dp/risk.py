"""What an attacker can achieve against one Gaussian release (the risk report of a DP answer).

The standard attacker knows the two neighbouring datasets and sees one release; by the
Neyman–Pearson lemma the best test projects the release on the direction of change, which turns
the problem into N(0, 1) against N(μ, 1) with μ = Δ/σ. Its trade-off:

* TPR at FPR α:  Φ(Φ⁻¹(α) + Δ/σ),
* AUC (area under that ROC curve):  Φ(Δ/(σ√2)).

The ROC paper (Matthews–Harel style, vector extension) scores a weaker attacker: it sees one
release computed on D and one computed on D' and compares them through the statistic
K = (X − X')²/(2σ²), which is χ²₁ with non-centrality λ = Δ²/(2σ²) when the datasets differ and
central χ²₁ otherwise. Its AUC is P(K₁ > K₀) for independent K₀ ~ χ²₁, K₁ ~ χ²₁(λ). Writing
K₁ = U², K₀ = V² with U ~ N(Δ/(σ√2), 1), V ~ N(0, 1): U − V and U + V are independent
N(Δ/(σ√2), 2), so P(U² > V²) = P((U−V)(U+V) > 0) gives the closed form

    AUC₂ = Φ(Δ/2σ)² + Φ(−Δ/2σ)².

(Δ is the L2 sensitivity: for a vector release this is the paper's attacker working on the
release's component along the direction of change.) Both curves are reported; controllers should
judge by the standard one, which is the stronger attack.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from pydantic import BaseModel, ConfigDict, Field

from safeaccess.rules.dp.accounting import gaussian_epsilon
from safeaccess.rules.dp.errors import (
    check_delta,
    check_non_negative,
    check_positive,
    check_probability,
)

_STD = NormalDist()
REPORTED_FPRS: tuple[float, ...] = (0.01, 0.05, 0.1)


def gaussian_tpr(sensitivity: float, sigma: float, fpr: float) -> float:
    """Best attainable TPR at FPR α against one release: Φ(Φ⁻¹(α) + Δ/σ)."""
    mu = _mu(sensitivity, sigma)
    alpha = check_probability(fpr, "fpr")
    return _STD.cdf(_STD.inv_cdf(alpha) + mu)


def gaussian_auc(sensitivity: float, sigma: float) -> float:
    """Area under the best ROC curve against one release: Φ(Δ/(σ√2))."""
    return _STD.cdf(_mu(sensitivity, sigma) / math.sqrt(2.0))


def two_release_auc(sensitivity: float, sigma: float) -> float:
    """AUC of the ROC paper's two-release χ² attacker: Φ(Δ/2σ)² + Φ(−Δ/2σ)²."""
    half = _mu(sensitivity, sigma) / 2.0
    return _STD.cdf(half) ** 2 + _STD.cdf(-half) ** 2


class TradeoffPoint(BaseModel):
    model_config = ConfigDict(frozen=True)

    fpr: float
    tpr: float


class RiskReport(BaseModel):
    """Risk of one Gaussian release of L2 sensitivity Δ and noise σ."""

    model_config = ConfigDict(frozen=True)

    sensitivity: float = Field(description="L2 sensitivity Δ of the released query")
    sigma: float = Field(description="standard deviation of the Gaussian noise")
    mu: float = Field(description="Δ/σ: the release is μ-GDP")
    tradeoff: list[TradeoffPoint] = Field(
        description="best attacker's TPR at FPR 0.01, 0.05, 0.1: Φ(Φ⁻¹(α) + Δ/σ)"
    )
    auc: float = Field(description="area under the best attacker's ROC curve: Φ(Δ/(σ√2))")
    two_release_auc: float = Field(
        description="AUC of the ROC paper's two-release χ² attacker: Φ(Δ/2σ)² + Φ(−Δ/2σ)²"
    )
    epsilon: float | None = Field(
        default=None, description="ε of this release alone at `delta` (when a δ was given)"
    )
    delta: float | None = None

    def tpr_at(self, fpr: float) -> float:
        for point in self.tradeoff:
            if point.fpr == fpr:
                return point.tpr
        return gaussian_tpr(self.sensitivity, self.sigma, fpr)


def risk_report(sensitivity: float, sigma: float, delta: float | None = None) -> RiskReport:
    """The risk report of one release (and its own ε at δ when δ is given)."""
    mu = _mu(sensitivity, sigma)
    return RiskReport(
        sensitivity=float(sensitivity),
        sigma=float(sigma),
        mu=mu,
        tradeoff=[
            TradeoffPoint(fpr=a, tpr=gaussian_tpr(sensitivity, sigma, a)) for a in REPORTED_FPRS
        ],
        auc=gaussian_auc(sensitivity, sigma),
        two_release_auc=two_release_auc(sensitivity, sigma),
        epsilon=None if delta is None else gaussian_epsilon(mu, check_delta(delta)),
        delta=None if delta is None else float(delta),
    )


def _mu(sensitivity: float, sigma: float) -> float:
    return check_non_negative(sensitivity, "sensitivity") / check_positive(sigma, "sigma")
