"""DP two-sample Hotelling test: level near nominal under H₀ and power rising with n (seeded
simulations, the paper's design: uniform data on a cube, shifted by a/√d per coordinate)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from safeaccess.rules.dp import DPParameterError, gaussian_mu_for
from safeaccess.rules.dp.hotelling import (
    GroupStatistics,
    hotelling_test,
    noise_scales,
    release_mean_comparison,
    sensitivities,
)

ROOT3 = math.sqrt(3.0)


def seeded_noise(rng: np.random.Generator):  # type: ignore[no-untyped-def]
    def noise(values: np.ndarray, sigma: float) -> np.ndarray:
        return np.asarray(values, dtype=float) + rng.normal(0.0, sigma, np.shape(values))

    return noise


def group(data: np.ndarray) -> GroupStatistics:
    return GroupStatistics(
        n=data.shape[0],
        mean=data.mean(axis=0).tolist(),
        covariance=np.atleast_2d(np.cov(data, rowvar=False)).tolist(),
    )


def run(rng: np.random.Generator, n: int, d: int, shift: float, mu: float) -> bool:
    lower, upper = [-ROOT3 - 1.0] * d, [ROOT3 + 1.0] * d
    x = rng.uniform(-ROOT3, ROOT3, (n, d))
    y = rng.uniform(-ROOT3, ROOT3, (n, d)) + shift / math.sqrt(d)
    release = release_mean_comparison(group(x), group(y), lower, upper, mu, seeded_noise(rng))
    return hotelling_test(
        release, alpha=0.05, bootstrap=100, seed=int(rng.integers(1 << 30))
    ).reject


def test_level_near_nominal_under_null() -> None:
    rng = np.random.default_rng(2022)
    mu = gaussian_mu_for(1.0, 1e-5)
    reps = 400
    rate = sum(run(rng, 400, 3, 0.0, mu) for _ in range(reps)) / reps
    # Nominal 5 %; 400 replications have a standard error of 1.1 %.
    assert 0.025 <= rate <= 0.08
    # Strong privacy, small groups, one dimension.
    strong = gaussian_mu_for(0.5, 1e-5)
    rate = sum(run(rng, 100, 1, 0.0, strong) for _ in range(reps)) / reps
    assert 0.025 <= rate <= 0.08


def test_power_rises_with_sample_size() -> None:
    rng = np.random.default_rng(7)
    mu = gaussian_mu_for(1.0, 1e-5)
    reps = 60
    rates = [sum(run(rng, n, 3, 0.5, mu) for _ in range(reps)) / reps for n in (100, 400, 1600)]
    assert rates[0] < 0.5 < rates[1] < rates[2]
    assert rates[2] > 0.95


def test_exact_statistics_without_noise_give_hotelling() -> None:
    # With vanishing noise t^DP is the classical t² (pooled covariance, n₁n₂/(n₁+n₂) factor).
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (50, 2))
    y = rng.uniform(-1, 1, (70, 2)) + 0.2
    release = release_mean_comparison(
        group(x), group(y), [-1, -1], [1.2, 1.2], 1e9, lambda v, s: np.asarray(v, float)
    )
    result = hotelling_test(release, bootstrap=20)
    diff = x.mean(0) - y.mean(0)
    pooled = (49 * np.cov(x, rowvar=False) + 69 * np.cov(y, rowvar=False)) / 118
    classical = 50 * 70 / 120 * diff @ np.linalg.solve(pooled, diff)
    assert result.statistic == pytest.approx(classical, rel=1e-6)


def test_release_through_opendp() -> None:
    from safeaccess.rules.dp.noise import gaussian_noise

    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (300, 2))
    y = rng.uniform(0, 1, (300, 2)) + 0.3
    release = release_mean_comparison(
        group(x), group(y), [0, 0], [1.3, 1.3], gaussian_mu_for(1.0, 1e-6), gaussian_noise
    )
    assert release.groups[0].count != 300  # the count is noisy under add/remove
    again = type(release).model_validate_json(release.model_dump_json())
    assert hotelling_test(again, seed=1) == hotelling_test(release, seed=1)
    assert hotelling_test(release, seed=1).reject


def test_sensitivities_and_budget_split() -> None:
    assert sensitivities([3.0, 4.0], "add_remove") == (1.0, 5.0, 25.0)
    assert sensitivities([3.0, 4.0], "replace") == (0.0, 10.0, pytest.approx(25 * math.sqrt(2)))
    sn, ss, sm = noise_scales([3.0, 4.0], "add_remove", 2.0)
    # The parts' μ² add up to the release's μ².
    assert (1 / sn) ** 2 + (5 / ss) ** 2 + (25 / sm) ** 2 == pytest.approx(4.0)
    sn, ss, sm = noise_scales([3.0, 4.0], "replace", 2.0)
    assert sn == 0.0 and (10 / ss) ** 2 + (25 * math.sqrt(2) / sm) ** 2 == pytest.approx(4.0)


def test_bad_inputs() -> None:
    good = GroupStatistics(n=10, mean=[0.0], covariance=[[1.0]])
    with pytest.raises(DPParameterError, match="upper bound must exceed"):
        release_mean_comparison(good, good, [1.0], [0.0], 1.0, lambda v, s: v)
    with pytest.raises(DPParameterError, match="covariance be 2x2"):
        release_mean_comparison(good, good, [0.0, 0.0], [1.0, 1.0], 1.0, lambda v, s: v)
    with pytest.raises(DPParameterError, match="outside the declared bounds"):
        release_mean_comparison(good, good, [1.0], [2.0], 1.0, lambda v, s: v)
    with pytest.raises(DPParameterError, match="mu must be"):
        release_mean_comparison(good, good, [-1.0], [2.0], 0.0, lambda v, s: v)
