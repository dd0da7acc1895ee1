"""Noise is drawn by OpenDP's Gaussian mechanism with the requested σ, never by numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from safeaccess.rules.dp import DPParameterError
from safeaccess.rules.dp.noise import gaussian_noise, opendp_rho


def test_noise_has_the_requested_distribution() -> None:
    sigma = 2.5
    values = np.linspace(-3.0, 3.0, 20_000)
    noise = gaussian_noise(values, sigma) - values
    assert noise.mean() == pytest.approx(0.0, abs=4 * sigma / math.sqrt(noise.size))
    assert noise.std() == pytest.approx(sigma, rel=0.03)
    # Kolmogorov–Smirnov against N(0, σ²).
    assert stats.kstest(noise / sigma, "norm").pvalue > 1e-4


def test_noise_is_fresh_and_not_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("numpy's generator must not draw DP noise")

    monkeypatch.setattr(np.random, "default_rng", forbidden)
    monkeypatch.setattr(np.random, "normal", forbidden)
    monkeypatch.setattr(np.random, "seed", forbidden)
    first = gaussian_noise([10.0, 20.0], 1.0)
    second = gaussian_noise([10.0, 20.0], 1.0)
    assert not np.array_equal(first, second)


def test_opendp_certifies_the_accounted_privacy() -> None:
    # OpenDP's own map: ρ-zCDP with ρ = (Δ/σ)²/2, i.e. μ = Δ/σ as the ledger charges.
    for sens, sigma in [(1.0, 1.0), (3.0, 7.5), (0.2, 0.05)]:
        assert opendp_rho(sens, sigma) == pytest.approx((sens / sigma) ** 2 / 2, rel=1e-9)


def test_bad_inputs() -> None:
    with pytest.raises(DPParameterError, match="sigma must be a finite number > 0"):
        gaussian_noise([1.0], 0.0)
    with pytest.raises(DPParameterError, match="finite"):
        gaussian_noise([1.0, math.nan], 1.0)
    with pytest.raises(DPParameterError, match="non-empty vector"):
        gaussian_noise([], 1.0)


def test_opendp_stays_out_of_the_sandbox() -> None:
    import subprocess
    import sys

    from safeaccess.sandbox.docker.image import _closure

    names = {dist.metadata["Name"].lower() for dist in _closure("safeaccess-sandbox")}
    assert "safeaccess-rules" in names
    assert "opendp" not in names
    # The pure parts of the library never load OpenDP.
    probe = (
        "import sys, safeaccess.rules.dp, safeaccess.rules.dp.transform, "
        "safeaccess.rules.dp.hotelling; print('opendp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
