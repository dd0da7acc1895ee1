"""Shoham–Rinott transformed queries: at equal (ε, δ) the optimal transform's region is smaller and
its test more powerful, in closed form and in simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from safeaccess.rules.dp import DPParameterError, analytic_gaussian_sigma
from safeaccess.rules.dp.transform import (
    confidence_region,
    likelihood_ratio_test,
    optimal_transform,
    power,
    region_volume,
    transform_answer,
    transformed_sensitivity,
    volume_ratio,
)

PSI = np.array([0.5, 1.0, 4.0])
EPS, DELTA = 1.0, 1e-6


def test_region_transform_is_inverse_square_with_same_sensitivity() -> None:
    xi = optimal_transform(PSI, "region")
    # ξᵢ = (‖ψ‖²/k)/ψᵢ² written out: ‖ψ‖² = 17.25, k = 3.
    np.testing.assert_allclose(xi, [17.25 / 3 / 0.25, 17.25 / 3 / 1.0, 17.25 / 3 / 16.0])
    assert transformed_sensitivity(PSI, xi) == pytest.approx(math.sqrt(17.25))
    np.testing.assert_allclose(optimal_transform([2.0, 2.0], "region"), [1.0, 1.0])


def test_test_transform_puts_all_weight_on_best_component() -> None:
    eta = np.array([1.0, 1.0, 3.0])  # ηᵢ²/ψᵢ² = 4, 1, 0.5625 → component 0
    xi = optimal_transform(PSI, "test", eta=eta)
    np.testing.assert_allclose(xi, [17.25 / 0.25, 0.0, 0.0])
    assert transformed_sensitivity(PSI, xi) == pytest.approx(math.sqrt(17.25))


def test_region_volume_closed_form_beats_plain_query() -> None:
    sigma = analytic_gaussian_sigma(EPS, DELTA, float(np.linalg.norm(PSI)))
    plain = region_volume(np.ones(3), sigma)
    best = region_volume(optimal_transform(PSI, "region"), sigma)
    # (GM/AM)^{k/2} with ψ² = (0.25, 1, 16): GM = 4^{1/3}, AM = 17.25/3.
    expected_ratio = (4 ** (1 / 3) / (17.25 / 3)) ** 1.5
    assert best / plain == pytest.approx(expected_ratio, rel=1e-12)
    assert volume_ratio(PSI) == pytest.approx(expected_ratio, rel=1e-12)
    assert best < plain
    # Volume of a 3-ball of radius σ√t at ξ = 1: (4/3)π(σ²t)^{3/2}, t = χ²₃(0.95) = 7.814728.
    assert plain == pytest.approx(4 / 3 * math.pi * (sigma**2 * 7.814727903) ** 1.5, rel=1e-8)
    # Any other ξ with the same sensitivity is no better (Theorem 1).
    rng = np.random.default_rng(3)
    for _ in range(200):
        v = rng.dirichlet(np.ones(3)) * float(PSI @ PSI)
        xi = v / PSI**2
        assert region_volume(xi, sigma) >= best * (1 - 1e-12)


def test_region_simulation_coverage_and_size() -> None:
    rng = np.random.default_rng(4)
    truth = np.array([3.0, -1.0, 10.0])
    sigma = analytic_gaussian_sigma(EPS, DELTA, float(np.linalg.norm(PSI)))
    reps = 2000
    results = {}
    for name, xi in {"plain": np.ones(3), "optimal": optimal_transform(PSI, "region")}.items():
        covered = 0
        box_widths = []
        for _ in range(reps):
            answer = transform_answer(truth, xi) + rng.normal(0.0, sigma, 3)
            region = confidence_region(answer, xi, sigma, 0.95)
            covered += region.contains(truth)
            box_widths.append(np.prod(np.subtract(region.box_upper, region.box_lower)))
        results[name] = (covered / reps, region.volume, float(np.mean(box_widths)))
    for coverage, _, _ in results.values():
        assert coverage == pytest.approx(0.95, abs=4 * math.sqrt(0.95 * 0.05 / reps))
    assert results["optimal"][1] < results["plain"][1]
    # The simulated regions' bounding boxes shrink by the same ratio as the ellipsoids.
    assert results["optimal"][2] / results["plain"][2] == pytest.approx(volume_ratio(PSI), rel=1e-9)


def test_power_closed_form_and_simulation_beat_plain_query() -> None:
    eta = np.array([3.0, 2.0, 5.0])
    sigma = analytic_gaussian_sigma(EPS, DELTA, float(np.linalg.norm(PSI)))
    xi_best = optimal_transform(PSI, "test", eta=eta)
    p_plain = power(np.ones(3), eta, sigma)
    p_best = power(xi_best, eta, sigma)
    # Closed form: 1 − Φ(z₀.₉₅ − √(ηᵀDiag(ξ)η)/σ), here for ξ = 1.
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.95)
    assert p_plain == pytest.approx(1 - NormalDist().cdf(z - float(np.linalg.norm(eta)) / sigma))
    assert p_best > p_plain

    rng = np.random.default_rng(5)
    reps = 3000
    simulated = []
    for xi, expected in ((np.ones(3), p_plain), (xi_best, p_best)):
        rejections = 0
        level = 0
        for _ in range(reps):
            noise = rng.normal(0.0, sigma, 3)
            rejections += likelihood_ratio_test(
                transform_answer(eta, xi) + noise, xi, eta, sigma
            ).reject
            level += likelihood_ratio_test(
                transform_answer(np.zeros(3), xi) + noise, xi, eta, sigma
            ).reject
        se = math.sqrt(expected * (1 - expected) / reps)
        assert rejections / reps == pytest.approx(expected, abs=4 * se)
        assert level / reps == pytest.approx(0.05, abs=4 * math.sqrt(0.05 * 0.95 / reps))
        simulated.append(rejections / reps)
    assert simulated[1] > simulated[0] + 0.2  # 0.41 against 0.10 in formula


def test_bad_inputs() -> None:
    with pytest.raises(DPParameterError, match="goal must be"):
        optimal_transform(PSI, "volume")  # type: ignore[arg-type]
    with pytest.raises(DPParameterError, match="needs the alternative eta"):
        optimal_transform(PSI, "test")
    with pytest.raises(DPParameterError, match="per-component sensitivity must be > 0"):
        optimal_transform([1.0, 0.0], "region")
    with pytest.raises(DPParameterError, match="eta has 2 components"):
        optimal_transform(PSI, "test", eta=[1.0, 2.0])
    with pytest.raises(DPParameterError, match="xi > 0"):
        confidence_region([1.0, 2.0], [1.0, 0.0], 1.0)
