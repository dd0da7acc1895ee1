"""Two-sample Hotelling t² test under differential privacy (after Dunsche, Kutta & Dette, PSD 2022).

The paper privatises the four inputs of Hotelling's statistic (two means, two covariances), forms
t^DP from them with a correction for the noise in the means, and calibrates the rejection threshold
by a parametric bootstrap that mimics the privatised statistic. We keep that structure, with two
changes (derived in docs/dp.md):

* Gaussian instead of Laplace/ED noise, on each group's centred sufficient statistics (count, sum,
  sum of outer products of the data clipped to the declared box), so that the release is a single
  Gaussian mechanism that the GDP ledger accounts exactly; means and covariances are
  post-processing of these.
* The mean-noise correction re-derived: with τ_g² the per-coordinate variance of the noise in
  group g's mean, √(n₁n₂/(n₁+n₂))·(X̄ᴰᴾ − Ȳᴰᴾ) has covariance Σ + (n₁n₂/(n₁+n₂))(τ₁² + τ₂²)I, so that
  is the matrix t^DP standardises by. The paper adds only τ₁² + τ₂² (its c₁ + c₂), under-scaled by
  the factor n₁n₂/(n₁+n₂); its covariance algorithm also returns Σ̂ in units normalised by dm².

The bootstrap redraws the whole privatised release under H₀ (sufficient statistics of normal data
with the estimated covariances, then the same noise) and recomputes t^DP exactly as for the real
release, so the threshold accounts for the noise in the covariances too, not only in the means.

This module is pure: the noise for the real release is drawn by the `noise` function the caller
passes (the server passes `safeaccess.rules.dp.noise.gaussian_noise`, i.e. OpenDP). The bootstrap
is post-processing of released values and uses a seeded numpy generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field
from scipy import stats

from safeaccess.rules.dp.errors import DPParameterError, check_positive, check_probability

Relation = Literal["add_remove", "replace"]
NoiseFn = Callable[[NDArray[np.float64], float], NDArray[np.float64]]
FloatArray = NDArray[np.float64]
# Smallest eigenvalue kept when a noisy covariance is projected to a positive-definite matrix,
# relative to the box's squared half-widths (the scale of any covariance of clipped data).
_EIGEN_FLOOR = 1e-6


class GroupStatistics(BaseModel):
    """Exact statistics of one group's data, clipped to the declared bounds (from the sandbox)."""

    model_config = ConfigDict(frozen=True)

    n: int = Field(ge=1, description="number of records in the group")
    mean: list[float] = Field(min_length=1, description="mean vector of the clipped data")
    covariance: list[list[float]] = Field(
        description="sample covariance of the clipped data (n − 1 divisor; zeros when n = 1)"
    )


class NoisyGroup(BaseModel):
    """One group's released (noisy) centred sufficient statistics."""

    model_config = ConfigDict(frozen=True)

    count: float = Field(description="n + noise (exact n under the replace relation)")
    centred_sum: list[float] = Field(description="Σ(x − c) + noise")
    centred_moments: list[list[float]] = Field(description="Σ(x − c)(x − c)ᵀ + symmetric noise")


class HotellingRelease(BaseModel):
    """What a DP mean-comparison releases: both groups' noisy statistics and how they were made."""

    model_config = ConfigDict(frozen=True)

    groups: tuple[NoisyGroup, NoisyGroup]
    centre: list[float] = Field(description="c, the centre of the declared box")
    half_width: list[float] = Field(description="h, the half-widths of the declared box")
    relation: Relation
    sigma_count: float = Field(description="noise σ on the counts (0: counts exact and public)")
    sigma_sum: float
    sigma_moments: float
    mu: float = Field(description="the release is μ-GDP: charge μ² to the ledger")


class HotellingResult(BaseModel):
    """The DP Hotelling test's outcome (post-processing of a HotellingRelease)."""

    model_config = ConfigDict(frozen=True)

    statistic: float = Field(description="t^DP")
    critical_value: float = Field(description="bootstrap (1 − α) quantile of t^DP under H₀")
    p_value: float = Field(description="bootstrap p-value (B + 1 correction)")
    reject: bool
    alpha: float
    bootstrap: int
    chi2_p_value: float = Field(description="asymptotic χ²_d p-value (unreliable for small n)")
    means: tuple[list[float], list[float]]
    pooled_covariance: list[list[float]]
    group_sizes: tuple[float, float]


def sensitivities(half_width: Sequence[float], relation: Relation) -> tuple[float, float, float]:
    """L2 sensitivities of (count, Σ(x−c), upper triangle of Σ(x−c)(x−c)ᵀ) for one record.

    add_remove: 1, ‖h‖, ‖h‖² (one record's own contribution, ‖vvᵀ‖_F = ‖v‖²).
    replace: 0, 2‖h‖, √2‖h‖² (‖vvᵀ − wwᵀ‖_F² = ‖v‖⁴ + ‖w‖⁴ − 2(v·w)² ≤ 2‖h‖⁴).
    A record belongs to one group, so the two groups' releases compose in parallel.
    """
    h = float(np.linalg.norm(np.asarray(half_width, dtype=np.float64)))
    if relation == "add_remove":
        return 1.0, h, h * h
    if relation == "replace":
        return 0.0, 2.0 * h, math.sqrt(2.0) * h * h
    raise DPParameterError(f"relation must be 'add_remove' or 'replace', got {relation!r}")


def noise_scales(
    half_width: Sequence[float],
    relation: Relation,
    mu: float,
    shares: tuple[float, float, float] = (0.1, 0.45, 0.45),
) -> tuple[float, float, float]:
    """σ for (count, sum, moments) spending the fractions `shares` of μ² on each part.

    Under `replace` the count is exact and its share goes to the other two parts.
    """
    m = check_positive(mu, "mu")
    d_n, d_s, d_m = sensitivities(half_width, relation)
    share_n, share_s, share_m = (float(s) for s in shares)
    if min(share_n, share_s, share_m) < 0 or share_s <= 0 or share_m <= 0:
        raise DPParameterError("shares must be >= 0 with positive sum and moment parts")
    if d_n == 0.0:
        share_n = 0.0
    elif share_n <= 0:
        raise DPParameterError("the count needs a positive share under add_remove")
    total = share_n + share_s + share_m
    sigma_n = 0.0 if d_n == 0.0 else d_n / (m * math.sqrt(share_n / total))
    sigma_s = d_s / (m * math.sqrt(share_s / total))
    sigma_m = d_m / (m * math.sqrt(share_m / total))
    return sigma_n, sigma_s, sigma_m


def release_mean_comparison(
    first: GroupStatistics,
    second: GroupStatistics,
    lower: Sequence[float],
    upper: Sequence[float],
    mu: float,
    noise: NoiseFn,
    relation: Relation = "add_remove",
) -> HotellingRelease:
    """Privatise two groups' exact clipped statistics as one μ-GDP Gaussian release.

    `noise(values, sigma)` must return values + N(0, σ²I) (the server passes OpenDP's mechanism).
    """
    lo = np.asarray(lower, dtype=np.float64)
    hi = np.asarray(upper, dtype=np.float64)
    if lo.ndim != 1 or lo.shape != hi.shape or not np.all(np.isfinite(lo) & np.isfinite(hi)):
        raise DPParameterError("lower and upper must be finite vectors of the same length")
    if np.any(hi <= lo):
        raise DPParameterError("every upper bound must exceed its lower bound")
    d = lo.size
    centre = (lo + hi) / 2.0
    half = (hi - lo) / 2.0
    sigma_n, sigma_s, sigma_m = noise_scales(half.tolist(), relation, mu)
    iu = np.triu_indices(d)
    groups = []
    for group in (first, second):
        mean, cov = _group_arrays(group, d)
        if np.any(mean < lo - 1e-9 * (1 + np.abs(lo))) or np.any(
            mean > hi + 1e-9 * (1 + np.abs(hi))
        ):
            raise DPParameterError("a group mean lies outside the declared bounds (clip first)")
        offset = mean - centre
        centred_sum = group.n * offset
        moments = (group.n - 1) * cov + group.n * np.outer(offset, offset)
        count = (
            float(group.n)
            if sigma_n == 0.0
            else float(noise(np.array([group.n], float), sigma_n)[0])
        )
        noisy_sum = noise(centred_sum, sigma_s)
        noisy_upper = noise(moments[iu], sigma_m)
        noisy_moments = np.zeros((d, d))
        noisy_moments[iu] = noisy_upper
        noisy_moments = noisy_moments + np.triu(noisy_moments, 1).T
        groups.append(
            NoisyGroup(
                count=count,
                centred_sum=np.asarray(noisy_sum, dtype=np.float64).tolist(),
                centred_moments=noisy_moments.tolist(),
            )
        )
    return HotellingRelease(
        groups=(groups[0], groups[1]),
        centre=centre.tolist(),
        half_width=half.tolist(),
        relation=relation,
        sigma_count=sigma_n,
        sigma_sum=sigma_s,
        sigma_moments=sigma_m,
        mu=float(mu),
    )


def hotelling_test(
    release: HotellingRelease, alpha: float = 0.05, bootstrap: int = 200, seed: int = 0
) -> HotellingResult:
    """t^DP and its bootstrap-calibrated decision (post-processing only)."""
    level = check_probability(alpha, "alpha")
    if bootstrap < 10:
        raise DPParameterError("bootstrap must be at least 10 replications")
    c = np.asarray(release.centre)
    h = np.asarray(release.half_width)
    d = c.size
    floor = _EIGEN_FLOOR * max(float(np.dot(h, h)), 1e-300)
    sizes, sums, moments = _noisy_arrays(release)
    t_obs, means, covs, pooled = _statistic(
        sizes[None], sums[None], moments[None], c, release.sigma_sum, floor
    )

    # Parametric bootstrap under H0: common mean (pooled estimate), each group's own estimated
    # covariance, sufficient statistics of normal data, then the same noise as the release.
    rng = np.random.default_rng(seed)
    n_hat = np.maximum(sizes, 2.0)
    weights = n_hat / n_hat.sum()
    common = weights[0] * means[0, 0] + weights[1] * means[0, 1]
    iu = np.triu_indices(d)
    b_sizes = np.empty((bootstrap, 2))
    b_sums = np.empty((bootstrap, 2, d))
    b_moments = np.empty((bootstrap, 2, d, d))
    for g in range(2):
        n = max(round(float(sizes[g])), d + 1)
        chol = np.linalg.cholesky(covs[0, g])
        xbar = common + rng.standard_normal((bootstrap, d)) @ chol.T / math.sqrt(n)
        scatter = _wishart(rng, n - 1, chol, bootstrap)
        off = xbar - c
        b_sizes[:, g] = n + (
            rng.normal(0.0, release.sigma_count, bootstrap) if release.sigma_count else 0.0
        )
        b_sums[:, g] = n * off + rng.normal(0.0, release.sigma_sum, (bootstrap, d))
        upper = np.zeros((bootstrap, d, d))
        upper[:, iu[0], iu[1]] = rng.normal(0.0, release.sigma_moments, (bootstrap, iu[0].size))
        noise = upper + np.triu(upper, 1).transpose(0, 2, 1)
        b_moments[:, g] = scatter + n * off[:, :, None] * off[:, None, :] + noise
    t_boot, *_ = _statistic(b_sizes, b_sums, b_moments, c, release.sigma_sum, floor)
    statistic = float(t_obs[0])
    t_sorted = np.sort(t_boot)
    critical = float(t_sorted[max(math.floor((1.0 - level) * bootstrap) - 1, 0)])
    p_value = float((1 + np.sum(t_boot >= statistic)) / (bootstrap + 1))
    return HotellingResult(
        statistic=statistic,
        critical_value=critical,
        p_value=p_value,
        reject=statistic > critical,
        alpha=level,
        bootstrap=bootstrap,
        chi2_p_value=float(stats.chi2.sf(statistic, d)),
        means=(means[0, 0].tolist(), means[0, 1].tolist()),
        pooled_covariance=pooled[0].tolist(),
        group_sizes=(float(sizes[0]), float(sizes[1])),
    )


def _wishart(rng: np.random.Generator, df: int, chol: FloatArray, count: int) -> FloatArray:
    """`count` draws of Wishart(df, LLᵀ) by Bartlett's decomposition (L = chol)."""
    d = chol.shape[0]
    a = np.zeros((count, d, d))
    for i in range(d):
        a[:, i, i] = np.sqrt(rng.chisquare(df - i, count))
        a[:, i, :i] = rng.standard_normal((count, i))
    la = chol @ a
    return np.asarray(la @ la.transpose(0, 2, 1), dtype=np.float64)


def _statistic(
    sizes: FloatArray,
    sums: FloatArray,
    moments: FloatArray,
    centre: FloatArray,
    sigma_sum: float,
    floor: float,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """t^DP from noisy sufficient statistics, batched over the first axis (the release itself is a
    batch of one; the bootstrap draws use exactly the same code).

    Shapes: sizes (B, 2), sums (B, 2, d), moments (B, 2, d, d). Returns t (B,), means (B, 2, d),
    positive-definite group covariances (B, 2, d, d) and the pooled covariance (B, d, d).
    """
    d = centre.size
    n = np.maximum(sizes, 2.0)
    offset = sums / n[:, :, None]
    second = moments / n[:, :, None, None]
    raw = (n / (n - 1.0))[:, :, None, None] * (
        second - offset[:, :, :, None] * offset[:, :, None, :]
    )
    covs = _positive_definite(raw, floor)
    means = centre + offset
    n1, n2 = n[:, 0], n[:, 1]
    pooled = ((n1 - 1.0)[:, None, None] * covs[:, 0] + (n2 - 1.0)[:, None, None] * covs[:, 1]) / (
        n1 + n2 - 2.0
    )[:, None, None]
    factor = n1 * n2 / (n1 + n2)
    # Per-coordinate variance of the noise in the two noisy means: σ_sum²/n₁² + σ_sum²/n₂².
    tau2 = sigma_sum**2 * (1.0 / n1**2 + 1.0 / n2**2)
    standardiser = pooled + (factor * tau2)[:, None, None] * np.eye(d)
    diff = means[:, 0] - means[:, 1]
    solved = np.linalg.solve(standardiser, diff[:, :, None])[:, :, 0]
    t = factor * np.einsum("bi,bi->b", diff, solved)
    return t, means, covs, pooled


def _positive_definite(cov: FloatArray, floor: float) -> FloatArray:
    """Symmetrise and lift eigenvalues to at least `floor` (batched over leading axes)."""
    sym = (cov + np.swapaxes(cov, -1, -2)) / 2.0
    values, vectors = np.linalg.eigh(sym)
    values = np.maximum(values, floor)
    return np.asarray((vectors * values[..., None, :]) @ np.swapaxes(vectors, -1, -2))


def _group_arrays(group: GroupStatistics, d: int) -> tuple[FloatArray, FloatArray]:
    mean = np.asarray(group.mean, dtype=np.float64)
    cov = np.asarray(group.covariance, dtype=np.float64)
    if mean.shape != (d,) or cov.shape != (d, d):
        raise DPParameterError(
            f"a group's mean must have {d} entries and its covariance be {d}x{d} (one per bound)"
        )
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(cov))):
        raise DPParameterError("group statistics must be finite")
    return mean, cov


def _noisy_arrays(release: HotellingRelease) -> tuple[FloatArray, FloatArray, FloatArray]:
    sizes = np.array([g.count for g in release.groups], dtype=np.float64)
    sums = np.array([g.centred_sum for g in release.groups], dtype=np.float64)
    moments = np.array([g.centred_moments for g in release.groups], dtype=np.float64)
    return sizes, sums, moments
