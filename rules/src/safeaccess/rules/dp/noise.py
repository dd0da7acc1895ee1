"""Drawing Gaussian noise with OpenDP (server side only).

The noise of every DP release is drawn here, by OpenDP's Gaussian mechanism, never by numpy's
generator: OpenDP samples from a cryptographically secure source and is floating-point safe (it
rounds the input to a fine lattice and adds exact discrete-Gaussian noise there, so the released
floats do not leak the low-order bits of the exact answer the way `x + rng.normal()` does).

This module imports OpenDP, a large native library, so only the server imports it; the rules
package is also installed in the sandbox image, which must stay free of it and never sees noise.
It comes with the `safeaccess-rules[noise]` extra.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import opendp.prelude as dp
from numpy.typing import ArrayLike, NDArray

from safeaccess.rules.dp.errors import DPParameterError, check_positive

# OpenDP gates its constructors behind explicit opt-ins. "contrib" is needed because the Gaussian
# measurement is a contributed (not yet formally vetted) component of OpenDP. We deliberately do
# NOT enable "floating-point" or "honest-but-curious": the float Gaussian used here is the
# lattice-based, floating-point-safe sampler that needs neither.
dp.enable_features("contrib")

_SPACE = (dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l2_distance(T=float))


def gaussian_noise(values: ArrayLike | Sequence[float], sigma: float) -> NDArray[np.float64]:
    """values + N(0, σ²I), drawn by OpenDP's Gaussian mechanism (returns a new float64 vector)."""
    sig = check_positive(sigma, "sigma")
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise DPParameterError(f"values must be a non-empty vector, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise DPParameterError("values must be finite numbers (clip to the declared bounds first)")
    measurement = dp.m.make_gaussian(*_SPACE, scale=sig)
    released = measurement([float(v) for v in arr])
    return np.asarray(released, dtype=np.float64)


def opendp_rho(sensitivity: float, sigma: float) -> float:
    """ρ (zero-concentrated DP) that OpenDP's own privacy map certifies for a release of L2
    sensitivity Δ with noise σ; ρ = μ²/2 up to OpenDP's lattice relaxation. Used as a cross-check
    that the mechanism drawing the noise is the one our accounting describes."""
    sig = check_positive(sigma, "sigma")
    sens = check_positive(sensitivity, "sensitivity")
    measurement = dp.m.make_gaussian(*_SPACE, scale=sig)
    rho = float(measurement.map(sens))
    if not math.isfinite(rho):  # pragma: no cover - OpenDP returns +inf only for σ = 0
        raise DPParameterError("OpenDP could not certify this release")
    return rho
