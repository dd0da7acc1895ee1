"""Privacy accounting for Gaussian releases by Gaussian differential privacy (Dong, Roth & Su).

A Gaussian release with L2 sensitivity Δ and noise σ is μ-GDP with μ = Δ/σ: distinguishing two
neighbouring datasets from it is exactly as hard as telling N(0, 1) from N(μ, 1). Any sequence of
such releases, even chosen adaptively, is μ-GDP with μ = √Σ(Δᵢ/σᵢ)², and this is exact: the
composed mechanism's trade-off curve is that of a single Gaussian with that μ. The (ε, δ) pairs
of μ-GDP are exactly those of the analytic Gaussian bound with σ/Δ = 1/μ, so the ε reported at a
given δ is the smallest valid one for the releases made — no composition theorem is involved.

The ledger keeps only Σ(Δᵢ/σᵢ)² and the number of releases: a small immutable value that the
server stores in the same transaction as each release.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from safeaccess.rules.dp.calibration import _delta, analytic_gaussian_sigma
from safeaccess.rules.dp.errors import (
    DPParameterError,
    check_delta,
    check_epsilon,
    check_non_negative,
    check_positive,
)


class BudgetExceededError(DPParameterError):
    """The requested release does not fit in the remaining privacy budget."""


def compose_mu(*mus: float) -> float:
    """μ of the composition of μᵢ-GDP mechanisms: √Σμᵢ²."""
    return math.sqrt(math.fsum(check_non_negative(m, "mu") ** 2 for m in mus))


def gaussian_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (0 when μ = 0)."""
    m = check_non_negative(mu, "mu")
    eps = check_non_negative(epsilon, "epsilon")
    if m == 0.0:
        return 0.0
    return _delta(eps, 1.0 / m)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Smallest ε ≥ 0 such that μ-GDP implies (ε, δ)-DP (rounded up, never down)."""
    m = check_non_negative(mu, "mu")
    target = check_delta(delta)
    if m == 0.0:
        return 0.0
    s = 1.0 / m
    if _delta(0.0, s) <= target:
        return 0.0
    lo, hi = 0.0, 1.0
    while _delta(hi, s) > target:
        lo, hi = hi, hi * 2.0
    # Invariant: δ(lo) > target ≥ δ(hi); bisect until lo and hi are adjacent floats.
    while True:
        mid = lo + (hi - lo) / 2.0
        if not (lo < mid < hi):
            return hi
        if _delta(mid, s) > target:
            lo = mid
        else:
            hi = mid


def gaussian_mu_for(epsilon: float, delta: float) -> float:
    """Largest μ such that μ-GDP is (ε, δ)-DP (rounded down): Δ / analytic σ."""
    return _round_down(1.0 / analytic_gaussian_sigma(epsilon, delta, 1.0))


def release_share(sensitivity: float, sigma: float) -> float:
    """A release's share (Δ/σ)² of the composed μ², rounded up so that the ledger never under-counts."""
    sens = check_non_negative(sensitivity, "sensitivity")
    sig = check_positive(sigma, "sigma")
    return _round_up((sens / sig) ** 2)


class GaussianLedger(BaseModel):
    """What a scope has spent: Σ(Δᵢ/σᵢ)² over its Gaussian releases. Immutable; charge() returns
    the next value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spent: float = Field(default=0.0, ge=0.0, allow_inf_nan=False, description="Σ (Δᵢ/σᵢ)²")
    releases: int = Field(default=0, ge=0, description="number of Gaussian releases charged")

    @property
    def mu(self) -> float:
        """μ of everything released so far."""
        return math.sqrt(self.spent)

    def charge(self, sensitivity: float, sigma: float) -> GaussianLedger:
        """The ledger after one more release of L2 sensitivity Δ with noise σ."""
        return GaussianLedger(
            spent=_round_up(self.spent + release_share(sensitivity, sigma)),
            releases=self.releases + 1,
        )

    def epsilon_at(self, delta: float) -> float:
        """Spent ε at δ (exact for the composition, rounded up)."""
        return gaussian_epsilon(self.mu, delta)

    def delta_at(self, epsilon: float) -> float:
        """Spent δ at ε."""
        return gaussian_delta(self.mu, epsilon)

    def remaining_for(self, epsilon: float, delta: float) -> float:
        """Largest additional Σ(Δ/σ)² share that keeps the total within the (ε, δ) budget.

        A new release of sensitivity Δ fits iff (Δ/σ)² ≤ this value, i.e. σ ≥ Δ/√value.
        """
        allowed = _round_down(gaussian_mu_for(epsilon, delta) ** 2)
        return max(0.0, _round_down(allowed - self.spent))

    def fits(self, sensitivity: float, sigma: float, epsilon: float, delta: float) -> bool:
        """Whether one more release (Δ, σ) keeps the total within the (ε, δ) budget."""
        allowed = _round_down(gaussian_mu_for(epsilon, delta) ** 2)
        return self.charge(sensitivity, sigma).spent <= allowed

    def sigma_for(self, sensitivity: float, epsilon: float, delta: float) -> float:
        """Smallest σ (rounded up) for a release of sensitivity Δ within the total (ε, δ) budget.

        Raises BudgetExceededError when nothing is left.
        """
        sens = check_positive(sensitivity, "sensitivity")
        check_epsilon(epsilon)
        check_delta(delta)
        remaining = self.remaining_for(epsilon, delta)
        if remaining <= 0.0:
            raise BudgetExceededError(
                f"privacy budget (epsilon={epsilon}, delta={delta}) is exhausted: "
                f"{self.releases} releases have spent epsilon={self.epsilon_at(delta):.6g}"
            )
        sigma = _round_up(sens / math.sqrt(remaining))
        while not self.fits(sens, sigma, epsilon, delta):
            sigma = _round_up(sigma * (1.0 + 1e-15))
        return sigma


def _round_up(x: float) -> float:
    return math.nextafter(x, math.inf)


def _round_down(x: float) -> float:
    return max(0.0, math.nextafter(x, 0.0))
