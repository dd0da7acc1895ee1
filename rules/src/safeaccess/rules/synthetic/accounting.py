"""Gaussian-DP accounting of a marginal workload and the MST-G noise split.

One record adds 1 to one cell of every marginal, so a marginal (or any release where a record
moves c entries by at most 1 each) has L2 sensitivity m * sqrt(c) for a unit of at most m records.
A workload of Gaussian releases composes exactly in GDP: mu^2 = sum_i (m sqrt(c_i) / sigma_i)^2.
MST-G spends mu^2 in three Gaussian releases - the d one-way marginals, the P pair scores (one
vector, each score moving by at most m) and the K tree marginals - with no exponential mechanism.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from safeaccess.rules.dp.errors import DPParameterError, check_positive

DEFAULT_SHARES = (0.25, 0.10, 0.65)
_SHARE_TOL = 1e-9


def workload_mu(
    sigmas: ArrayLike,
    cells_per_record: ArrayLike | None = None,
    records_per_unit: int = 1,
) -> float:
    """mu of Gaussian releases with noise `sigmas[i]`, where one record moves
    `cells_per_record[i]` entries of release i by at most 1 (default 1: a marginal table)."""
    sig = np.asarray(sigmas, dtype=np.float64).ravel()
    if sig.size == 0:
        raise DPParameterError("sigmas is empty: a workload needs at least one release")
    if not np.all(np.isfinite(sig) & (sig > 0)):
        raise DPParameterError("every sigma must be a finite number > 0")
    cells = (
        np.ones_like(sig)
        if cells_per_record is None
        else np.asarray(cells_per_record, dtype=np.float64).ravel()
    )
    if cells.shape != sig.shape:
        raise DPParameterError(
            f"cells_per_record has {cells.size} entries but sigmas has {sig.size}"
        )
    if not np.all(np.isfinite(cells) & (cells >= 1)):
        raise DPParameterError("cells_per_record must be numbers >= 1")
    m = _units(records_per_unit)
    return math.sqrt(math.fsum((m * m * cells / (sig * sig)).tolist()))


def mst_sigmas(
    mu: float,
    columns: int | Sequence[object],
    pairs: int | Sequence[object],
    edges: int | Sequence[object],
    shares: Sequence[float] = DEFAULT_SHARES,
    records_per_unit: int = 1,
) -> tuple[float, float, float]:
    """(sigma_1, sigma_s, sigma_2) for the d one-way marginals, the P pair scores and the K tree
    (or listed) marginals, so that the three releases charge exactly mu^2 split by `shares`.

    sigma = m * sqrt(count) / (mu * sqrt(share)). A zero share is allowed only for an empty
    release and then gives an infinite sigma (nothing is released: `fixed` has no selection)."""
    total = check_positive(mu, "mu")
    m = _units(records_per_unit)
    counts = [_count(columns, "columns"), _count(pairs, "pairs"), _count(edges, "edges")]
    if len(shares) != 3:
        raise DPParameterError(
            f"shares must be three numbers (one-way, selection, tree), got {shares!r}"
        )
    parts = [float(s) for s in shares]
    if any(not math.isfinite(s) or s < 0 for s in parts) or abs(sum(parts) - 1.0) > _SHARE_TOL:
        raise DPParameterError(f"shares must be >= 0 and sum to 1, got {shares!r}")
    out = []
    for name, count, share in zip(("columns", "pairs", "edges"), counts, parts, strict=True):
        if count == 0:
            out.append(math.inf)
        elif share == 0:
            raise DPParameterError(f"{count} {name} to release but their share of mu^2 is 0")
        else:
            out.append(m * math.sqrt(count) / (total * math.sqrt(share)))
    return out[0], out[1], out[2]


def noisy_total(sums: ArrayLike, cells: ArrayLike, sigmas: ArrayLike) -> tuple[float, float]:
    """Inverse-variance weighted estimate of the record count from noisy marginals, and its sd.

    Marginal i sums to n plus noise of variance cells_i * sigma_i^2 (independent cells), so the
    weights are 1 / (cells_i sigma_i^2) and the estimate's sd is 1 / sqrt(sum of weights). Pure
    post-processing of released tables: the true count is never used."""
    s = np.asarray(sums, dtype=np.float64).ravel()
    c = np.asarray(cells, dtype=np.float64).ravel()
    sig = np.asarray(sigmas, dtype=np.float64).ravel()
    if s.size == 0 or not (s.shape == c.shape == sig.shape):
        raise DPParameterError(
            f"sums, cells and sigmas need one entry per marginal, got {s.size}, {c.size}, {sig.size}"
        )
    if not (np.all(np.isfinite(s)) and np.all(c >= 1) and np.all(np.isfinite(sig) & (sig > 0))):
        raise DPParameterError("sums must be finite, cells >= 1 and sigmas finite and > 0")
    weights = 1.0 / (c * sig * sig)
    total = float(np.sum(weights * s) / np.sum(weights))
    return total, float(1.0 / math.sqrt(float(np.sum(weights))))


def _units(records_per_unit: int) -> int:
    if isinstance(records_per_unit, bool) or int(records_per_unit) != records_per_unit:
        raise DPParameterError(
            f"records_per_unit must be an integer >= 1, got {records_per_unit!r}"
        )
    if records_per_unit < 1:
        raise DPParameterError(
            f"records_per_unit must be an integer >= 1, got {records_per_unit!r}"
        )
    return int(records_per_unit)


def _count(value: int | Sequence[object], name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise DPParameterError(f"{name} must be >= 0, got {value}")
        return value
    if isinstance(value, Sequence) and not isinstance(value, str):
        return len(value)
    raise DPParameterError(f"{name} must be a count or a sequence, got {value!r}")
