"""GDP accounting and the budget ledger, checked against dp-accounting's exact Gaussian profile and
its RDP and PLD accountants."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting.pld import privacy_loss_mechanism
from dp_accounting.rdp import rdp_privacy_accountant

from safeaccess.rules.dp import (
    BudgetExceededError,
    DPParameterError,
    GaussianLedger,
    analytic_gaussian_sigma,
    compose_mu,
    gaussian_delta,
    gaussian_epsilon,
)


def reference_delta(mu: float, epsilon: float) -> float:
    loss = privacy_loss_mechanism.GaussianPrivacyLoss(standard_deviation=1.0 / mu, sensitivity=1.0)
    return float(loss.get_delta_for_epsilon(epsilon))


@pytest.mark.parametrize("mu", [0.01, 0.1, 0.5, 1.0, 3.0, 10.0, 40.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-6, 1e-5, 1e-2])
def test_gaussian_epsilon_is_the_smallest_valid_epsilon(mu: float, delta: float) -> None:
    eps = gaussian_epsilon(mu, delta)
    if eps == 0.0:
        assert reference_delta(mu, 0.0) <= delta * (1 + 1e-9)
        return
    assert reference_delta(mu, eps) <= delta * (1 + 1e-9)
    assert reference_delta(mu, eps * (1 - 1e-9)) > delta


def test_epsilon_and_delta_are_inverse() -> None:
    for mu in [0.2, 1.0, 4.0]:
        for delta in [1e-8, 1e-5, 1e-3]:
            eps = gaussian_epsilon(mu, delta)
            assert gaussian_delta(mu, eps) == pytest.approx(delta, rel=1e-9)
    # A single release calibrated to (ε, δ) reports exactly that ε back.
    sigma = analytic_gaussian_sigma(1.0, 1e-5)
    assert gaussian_epsilon(1.0 / sigma, 1e-5) == pytest.approx(1.0, rel=1e-9)
    assert gaussian_epsilon(0.0, 1e-5) == 0.0
    assert gaussian_delta(0.0, 1.0) == 0.0


def test_composition_is_gaussian() -> None:
    assert compose_mu(3.0, 4.0) == pytest.approx(5.0)
    ledger = GaussianLedger()
    for sens, sigma in [(1.0, 2.0), (2.0, 5.0), (0.5, 1.0)]:
        ledger = ledger.charge(sens, sigma)
    assert ledger.mu == pytest.approx(math.sqrt(0.25 + 0.16 + 0.25))
    assert ledger.releases == 3
    # k identical releases with noise σ are one release with noise σ/√k.
    k, sigma = 100, 30.0
    many = GaussianLedger()
    for _ in range(k):
        many = many.charge(1.0, sigma)
    assert many.epsilon_at(1e-6) == pytest.approx(
        gaussian_epsilon(math.sqrt(k) / sigma, 1e-6), rel=1e-9
    )


@pytest.mark.parametrize("count", [10, 100, 1000])
def test_ledger_is_tighter_than_rdp_and_agrees_with_pld(count: int) -> None:
    sigma = analytic_gaussian_sigma(1.0, 1e-5) * math.sqrt(count) / 2.0
    delta = 1e-5
    ledger = GaussianLedger()
    for _ in range(count):
        ledger = ledger.charge(1.0, sigma)
    ours = ledger.epsilon_at(delta)

    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(sigma), count)
    assert ours < rdp.get_epsilon(delta)

    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(sigma), count)
    # PLD is a pessimistic discretisation of the same exact curve: just above ours.
    pld_eps = pld.get_epsilon(delta)
    assert ours <= pld_eps * (1 + 1e-9)
    assert ours == pytest.approx(pld_eps, rel=2e-2)


def test_ledger_serialises_and_is_immutable() -> None:
    ledger = GaussianLedger().charge(1.0, 3.0).charge(2.0, 7.5)
    again = GaussianLedger.model_validate_json(ledger.model_dump_json())
    assert again == ledger
    with pytest.raises(Exception, match="frozen"):
        ledger.spent = 0.0  # type: ignore[misc]
    with pytest.raises(Exception, match="greater than or equal"):
        GaussianLedger(spent=-1.0)


def test_remaining_budget_and_sigma_for_a_new_release() -> None:
    eps_budget, delta = 2.0, 1e-6
    ledger = GaussianLedger().charge(1.0, analytic_gaussian_sigma(1.0, delta))
    remaining = ledger.remaining_for(eps_budget, delta)
    full = (1.0 / analytic_gaussian_sigma(eps_budget, delta)) ** 2
    assert remaining == pytest.approx(full - ledger.spent, rel=1e-12)

    sigma = ledger.sigma_for(3.0, eps_budget, delta)
    after = ledger.charge(3.0, sigma)
    assert after.epsilon_at(delta) <= eps_budget * (1 + 1e-12)
    assert after.epsilon_at(delta) == pytest.approx(eps_budget, rel=1e-9)
    assert ledger.fits(3.0, sigma, eps_budget, delta)
    assert not ledger.fits(3.0, sigma * (1 - 1e-9), eps_budget, delta)
    assert after.remaining_for(eps_budget, delta) < 1e-12

    with pytest.raises(BudgetExceededError, match="exhausted"):
        GaussianLedger().charge(1.0, 0.01).sigma_for(1.0, eps_budget, delta)


def test_ledger_refuses_bad_values() -> None:
    with pytest.raises(DPParameterError, match="sigma must be a finite number > 0"):
        GaussianLedger().charge(1.0, 0.0)
    with pytest.raises(DPParameterError, match="delta must lie strictly between 0 and 1"):
        GaussianLedger().epsilon_at(0.0)
    with pytest.raises(DPParameterError, match="sensitivity must be a finite number > 0"):
        GaussianLedger().sigma_for(0.0, 1.0, 1e-6)
