"""The MST-G release: noisy one-way marginals, noisy pair scores, the tree, noisy tree marginals.

Every step is a Gaussian release drawn by OpenDP (`gaussian_noise`) on the server, so the GDP
ledger is charged exactly: mu^2 = (m sqrt d / s1)^2 + (m sqrt P / s_s)^2 + (m sqrt K / s2)^2.
The record count is never used: the independence tables behind the pair scores take the noisy
total. The exact tables come from the sandbox; nothing here sees records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from safeaccess.rules.dp.noise import gaussian_noise
from safeaccess.rules.synthetic import (
    SyntheticCheckError,
    max_spanning_tree,
    mst_sigmas,
    noisy_total,
    pair_scores,
    workload_mu,
)
from safeaccess.rules.synthetic.accounting import DEFAULT_SHARES

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class MstRelease:
    """Everything MST-G released (all public once released) and its exact GDP charge."""

    sigmas: tuple[float, float, float]
    noisy_oneways: tuple[FloatArray, ...]
    total: float
    total_sd: float
    noisy_scores: FloatArray
    pairs: tuple[tuple[int, int], ...]
    tree: tuple[tuple[int, int], ...]
    noisy_tree: tuple[FloatArray, ...]
    mu: float

    @property
    def charge(self) -> float:
        """mu^2 charged to the GDP ledger."""
        return self.mu**2


def mst_release(
    oneways: Sequence[ArrayLike],
    pair_tables: Mapping[tuple[int, int], ArrayLike],
    mu: float,
    *,
    records_per_unit: int = 1,
    shares: Sequence[float] = DEFAULT_SHARES,
) -> MstRelease:
    """Run MST-G's three Gaussian releases on exact tables (one-way tables per column, and the
    table of every pair (a, b) with a < b, flat or L_a x L_b) at total privacy `mu`."""
    d = len(oneways)
    if d < 2:
        raise SyntheticCheckError(f"MST needs at least 2 columns, got {d}")
    pairs = tuple(combinations(range(d), 2))
    missing = [p for p in pairs if p not in pair_tables]
    if missing:
        raise SyntheticCheckError(f"exact tables missing for pairs {missing[:5]}")
    m = records_per_unit
    s1, ss, s2 = mst_sigmas(mu, d, len(pairs), d - 1, shares, records_per_unit=m)
    exact1 = [np.asarray(t, dtype=np.float64).ravel() for t in oneways]
    noisy1 = _split(gaussian_noise(np.concatenate(exact1), s1), [t.size for t in exact1])
    total, total_sd = noisy_total([t.sum() for t in noisy1], [t.size for t in noisy1], [s1] * d)
    scores = pair_scores([pair_tables[p] for p in pairs], pairs, noisy1, total)
    noisy_scores = gaussian_noise(scores, ss)
    tree = tuple(max_spanning_tree(d, pairs, noisy_scores))
    exact2 = [np.asarray(pair_tables[p], dtype=np.float64).ravel() for p in tree]
    noisy2 = _split(gaussian_noise(np.concatenate(exact2), s2), [t.size for t in exact2])
    spent = workload_mu(
        [s1] * d + [ss] + [s2] * len(tree),
        [1] * d + [len(pairs)] + [1] * len(tree),
        records_per_unit=m,
    )
    return MstRelease(
        (s1, ss, s2),
        tuple(noisy1),
        total,
        total_sd,
        noisy_scores,
        pairs,
        tree,
        tuple(noisy2),
        spent,
    )


def _split(values: FloatArray, sizes: Sequence[int]) -> list[FloatArray]:
    return [np.asarray(v) for v in np.split(values, np.cumsum(sizes)[:-1])]
