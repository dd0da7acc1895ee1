"""Chen's statistical error (Eqs. 11-12) and the total variation distance of marginals."""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from safeaccess.rules.synthetic.errors import SyntheticCheckError

Stat = Literal["mean", "var", "sd"]
_STAT_ALIASES = {"variance": "var", "std": "sd"}


def statistical_error(
    real: ArrayLike, syn: ArrayLike, stat: Stat, ddof: int = 0
) -> tuple[NDArray[np.float64], float]:
    """Per column |stat(O) - stat(S)| / |stat(O)| x 100, and its mean over the columns (Eq. 12).

    `stat` is "mean", "var" or "sd" (with `ddof`). Where stat(O) = 0 the error is 0 if stat(S)
    is 0 too, else infinite: no finite percentage describes a departure from an exact zero."""
    o = _matrix(real, "real")
    s = _matrix(syn, "syn")
    if o.shape[1] != s.shape[1]:
        raise SyntheticCheckError(f"real has {o.shape[1]} columns but syn has {s.shape[1]}")
    if min(o.shape[0], s.shape[0]) <= ddof:
        raise SyntheticCheckError(f"each side needs more than ddof = {ddof} records")
    funcs = {
        "mean": lambda a: a.mean(axis=0),
        "var": lambda a: a.var(axis=0, ddof=ddof),
        "sd": lambda a: a.std(axis=0, ddof=ddof),
    }
    stat = _STAT_ALIASES.get(stat, stat)  # type: ignore[assignment]
    if stat not in funcs:
        raise SyntheticCheckError(f"stat must be 'mean', 'var' or 'sd', got {stat!r}")
    so, ss = funcs[stat](o), funcs[stat](s)
    diff = np.abs(so - ss)
    denom = np.abs(so)
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(denom > 0, diff / np.where(denom > 0, denom, 1.0) * 100.0, 0.0)
    pct = np.where((denom == 0) & (diff > 0), np.inf, pct)
    return pct.astype(np.float64), float(pct.mean())


def tvd(p: ArrayLike, q: ArrayLike) -> float:
    """Total variation distance of two count (or probability) tables after normalising each;
    negative entries (noisy counts) are clipped at 0 first."""
    a = np.clip(np.asarray(p, dtype=np.float64).ravel(), 0.0, None)
    b = np.clip(np.asarray(q, dtype=np.float64).ravel(), 0.0, None)
    if a.shape != b.shape or a.sum() <= 0 or b.sum() <= 0:
        raise SyntheticCheckError("tvd needs two tables of one shape with positive totals")
    return 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())


def _matrix(values: ArrayLike, name: str) -> NDArray[np.float64]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2 or not np.all(np.isfinite(arr)):
        raise SyntheticCheckError(f"{name} must be a finite 2-D array (records x columns)")
    return arr
