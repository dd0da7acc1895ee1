"""Leverage (hat values) of the records behind a model, reported as a fact for the rules.

A record's leverage h_i is the weight of its own response in its own fitted value
(fitted_i = h_i * y_i + sum over j != i of H_ij * y_j). When h_i is close to 1 the model fits that
record almost exactly, so its response can be read back from the released coefficients, whatever
the formula looks like (a two-valued numeric regressor, a polynomial of degree d on d + 1 values,
an interaction that isolates a record ...). For a model fitted by iteratively reweighted least
squares (logit, probit, Poisson) the hat matrix is taken at the fitted weights,
H = W^1/2 X (X'WX)^-1 X'W^1/2, which is what the estimates depend on at convergence.

Only the largest values leave the runner, never the records they belong to.
"""

from __future__ import annotations

import numpy as np

from safeaccess.rules.outputs import LeverageFacts

#: How many of the largest hat values the facts carry (enough to count the records over any
#: sensible limit; a count at this cap reads "at least").
TOP = 50


def hat_values(x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """diag(H) for the full-rank design `x`, at IRLS `weights` when given.

    From the thin QR decomposition of W^1/2 X: H = QQ', so h_i is the squared norm of row i of Q.
    """
    design = np.asarray(x, dtype=np.float64)
    if weights is not None:
        w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)
        design = design * np.sqrt(w)[:, None]
    with np.errstate(all="ignore"):
        q, _ = np.linalg.qr(design, mode="reduced")
        h = np.einsum("ij,ij->i", q, q)
    # a weight that overflowed (a Poisson mean beyond float range) leaves no usable value:
    # count such a record as fitted exactly rather than not at all
    return np.clip(np.nan_to_num(h, nan=1.0, posinf=1.0), 0.0, 1.0)


def glm_weights(family: str, x: np.ndarray, params: np.ndarray) -> np.ndarray | None:
    """The IRLS (Fisher scoring) weights at the estimates; None for OLS (unit weights).

    logit: mu(1 - mu); Poisson: mu; probit: phi(eta)^2 / (Phi(eta)(1 - Phi(eta))).
    """
    eta = np.asarray(x, dtype=np.float64) @ np.asarray(params, dtype=np.float64)
    if family == "ols":
        return None
    if family == "logit":
        mu = 1.0 / (1.0 + np.exp(-eta))
        return mu * (1.0 - mu)
    if family == "poisson":
        with np.errstate(over="ignore"):
            return np.exp(eta)
    if family == "probit":
        from scipy.stats import norm

        density = norm.pdf(eta)
        variance = norm.cdf(eta) * norm.sf(eta)
        return np.divide(density**2, variance, out=np.zeros_like(eta), where=variance > 0.0)
    raise ValueError(f"unknown family {family!r}")


def leverage_facts(hats: np.ndarray) -> LeverageFacts:
    """The largest hat values, descending, and how many records they are taken over."""
    h = np.asarray(hats, dtype=np.float64)
    k = min(TOP, h.size)
    top = np.sort(np.partition(h, h.size - k)[h.size - k :])[::-1] if k else np.array([])
    return LeverageFacts(
        n=int(h.size), max=float(top[0]) if k else 0.0, top=[float(v) for v in top]
    )


def simple_regression_hats(columns: np.ndarray) -> np.ndarray:
    """Per record, the largest leverage over the simple regressions y ~ 1 + x_j, for every
    non-constant column x_j: 1/n + (x_ij - mean_j)^2 / sum_i (x_ij - mean_j)^2.

    A correlation between a and b is the slope of the regression of b on a (scaled by the
    standard deviations) and of a on b, so a correlation matrix with the variables' means and
    standard deviations releases every such regression; its leverage depends on the regressor
    only.
    """
    data = np.asarray(columns, dtype=np.float64)
    n = data.shape[0]
    dev = data - data.mean(axis=0)
    sxx = (dev**2).sum(axis=0)
    varying = sxx > 0.0
    if n == 0:
        return np.zeros(0)
    if varying.sum() < 2:
        # no pair of varying variables, so no coefficient is defined: nothing is fitted
        return np.full(n, 1.0 / n)
    share = dev[:, varying] ** 2 / sxx[varying]
    return np.clip(1.0 / n + share.max(axis=1), 0.0, 1.0)


def group_indicator_hats(group_sizes: list[int]) -> np.ndarray:
    """Hat values of a regression on group indicators (a two-sample test): 1/n_g per record."""
    return np.concatenate([np.full(n, 1.0 / n) for n in group_sizes if n > 0] or [np.zeros(0)])
