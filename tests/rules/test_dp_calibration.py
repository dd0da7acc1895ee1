"""Analytic Gaussian calibration against Google's dp-accounting (an independent implementation)."""

from __future__ import annotations

import math

import pytest
from dp_accounting.pld import common, privacy_loss_mechanism
from hypothesis import given, settings
from hypothesis import strategies as st

from safeaccess.rules.dp import DPParameterError, analytic_gaussian_sigma, gaussian_delta_for

EPSILONS = [0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0]
DELTAS = [1e-12, 1e-9, 1e-6, 1e-5, 1e-3, 0.1]


def reference_delta(epsilon: float, sigma: float, sensitivity: float = 1.0) -> float:
    """δ(ε) of the Gaussian mechanism as dp-accounting computes it (exact, not discretised)."""
    loss = privacy_loss_mechanism.GaussianPrivacyLoss(
        standard_deviation=sigma, sensitivity=sensitivity
    )
    return float(loss.get_delta_for_epsilon(epsilon))


@pytest.mark.parametrize(
    ("epsilon", "delta", "expected"),
    [(1.0, 1e-5, 3.7306316348), (0.5, 1e-5, 7.0318266756)],
)
def test_published_values(epsilon: float, delta: float, expected: float) -> None:
    assert analytic_gaussian_sigma(epsilon, delta) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("delta", DELTAS)
def test_smallest_sigma_by_the_reference(epsilon: float, delta: float) -> None:
    sigma = analytic_gaussian_sigma(epsilon, delta)
    # Valid: the reference's exact δ at our σ is within the target (allowing its own float error).
    assert reference_delta(epsilon, sigma) <= delta * (1 + 1e-9)
    # Smallest to 1e-9: 1e-9 less noise breaks the target by the reference's reckoning.
    assert reference_delta(epsilon, sigma * (1 - 1e-9)) > delta


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("delta", [1e-9, 1e-5, 1e-3])
def test_matches_reference_calibration(epsilon: float, delta: float) -> None:
    ref = privacy_loss_mechanism.GaussianPrivacyLoss.from_privacy_guarantee(
        common.DifferentialPrivacyParameters(epsilon, delta), sensitivity=1.0
    ).standard_deviation
    # dp-accounting's own calibration stops its search a little above the exact root (its
    # search stops within ~1e-7 of it); the exact 1e-9 comparison is the test above, against its
    # exact δ(ε). Ours must not lie above its (safe-side) answer.
    ours = analytic_gaussian_sigma(epsilon, delta)
    assert ours == pytest.approx(ref, rel=1e-6)
    assert ours <= ref * (1 + 1e-12)


@pytest.mark.parametrize(
    ("epsilon", "delta"),
    [(1e-6, 1e-5), (0.01, 0.999), (50.0, 1e-5), (500.0, 1e-10), (1000.0, 0.5), (1.0, 1e-300)],
)
def test_extreme_parameters_are_finite_and_valid(epsilon: float, delta: float) -> None:
    sigma = analytic_gaussian_sigma(epsilon, delta)
    assert math.isfinite(sigma) and sigma > 0
    assert gaussian_delta_for(epsilon, sigma) <= delta
    assert gaussian_delta_for(epsilon, math.nextafter(sigma, 0) * (1 - 1e-12)) > delta


def test_rounded_on_the_safe_side_for_any_sensitivity() -> None:
    for sensitivity in [1e-6, 0.3, 1.0, 7.0, 1234.5]:
        for epsilon in [0.1, 1.0, 3.0]:
            sigma = analytic_gaussian_sigma(epsilon, 1e-6, sensitivity)
            assert gaussian_delta_for(epsilon, sigma / sensitivity) <= 1e-6
            assert sigma == pytest.approx(
                sensitivity * analytic_gaussian_sigma(epsilon, 1e-6), rel=1e-14
            )


def test_more_privacy_needs_more_noise() -> None:
    sigmas = [analytic_gaussian_sigma(e, 1e-6) for e in [0.05, 0.1, 0.5, 1, 2, 8]]
    assert sigmas == sorted(sigmas, reverse=True)
    assert analytic_gaussian_sigma(1, 1e-8) > analytic_gaussian_sigma(1, 1e-4)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0.0, 1e-5), "epsilon must be a finite number > 0"),
        ((-1.0, 1e-5), "epsilon must be a finite number > 0"),
        ((math.inf, 1e-5), "epsilon must be a finite number > 0"),
        ((math.nan, 1e-5), "epsilon must be a finite number > 0"),
        ((1.0, 0.0), "delta must lie strictly between 0 and 1"),
        ((1.0, 1.0), "delta must lie strictly between 0 and 1"),
        ((1.0, math.nan), "delta must lie strictly between 0 and 1"),
        ((1.0, 1e-5, 0.0), "sensitivity must be a finite number > 0"),
        ((1.0, 1e-5, -2.0), "sensitivity must be a finite number > 0"),
        (("one", 1e-5), "epsilon must be a number"),
        ((True, 1e-5), "epsilon must be a number"),
    ],
)
def test_invalid_inputs_are_refused_clearly(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(DPParameterError, match=message):
        analytic_gaussian_sigma(*args)  # type: ignore[arg-type]
    assert issubclass(DPParameterError, ValueError)


@settings(max_examples=300, deadline=None)
@given(
    epsilon=st.floats(min_value=1e-4, max_value=200.0),
    log_delta=st.floats(min_value=-40.0, max_value=-0.5),
    sensitivity=st.floats(min_value=1e-3, max_value=1e3),
)
def test_always_valid_and_tight(epsilon: float, log_delta: float, sensitivity: float) -> None:
    delta = 10.0**log_delta
    sigma = analytic_gaussian_sigma(epsilon, delta, sensitivity)
    assert gaussian_delta_for(epsilon, sigma / sensitivity) <= delta
    assert gaussian_delta_for(epsilon, sigma * (1 - 1e-9) / sensitivity) > delta
