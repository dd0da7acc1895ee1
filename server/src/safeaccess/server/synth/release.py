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
from numpy.typing import ArrayLike

from safeaccess.client.synthetic import SynthColumn, SynthWorkload
from safeaccess.rules.synthetic import SyntheticCheckError
from safeaccess.server.synth.measure import FloatArray, measure


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
) -> MstRelease:
    """Run MST-G's three Gaussian releases on exact tables (one-way tables per column, and the
    table of every pair (a, b) with a < b, flat or L_a x L_b) at total privacy `mu`: the
    `mst` method of `measure` (the step's own releases) on a workload of unnamed columns."""
    d = len(oneways)
    if d < 2:
        raise SyntheticCheckError(f"MST needs at least 2 columns, got {d}")
    pairs = tuple(combinations(range(d), 2))
    missing = [p for p in pairs if p not in pair_tables]
    if missing:
        raise SyntheticCheckError(f"exact tables missing for pairs {missing[:5]}")
    exact1 = [np.asarray(t, dtype=np.float64).ravel() for t in oneways]
    columns = tuple(
        SynthColumn(f"c{i}", "categorical", tuple(range(t.size)), None, False, None)
        for i, t in enumerate(exact1)
    )
    work = SynthWorkload("mst", columns, pairs, (), (), ())
    exact2 = [np.asarray(pair_tables[p], dtype=np.float64).ravel() for p in pairs]
    got = measure(work, [*exact1, *exact2], mu, records_per_unit)
    assert got.sigma_selection is not None and got.noisy_scores is not None  # the mst method
    return MstRelease(
        (got.sigma_oneway, got.sigma_selection, got.sigma_cliques),
        tuple(m.values for m in got.oneways),
        got.total,
        got.total_sd,
        got.noisy_scores,
        pairs,
        got.tree,
        tuple(m.values for m in got.cliques),
        got.mu,
    )
