"""The Gaussian releases of one `synthetic_data` step, drawn on the server from exact tables.

`mst`: the one-way marginals, the pair-score vector (the tree is Kruskal on the noisy scores:
post-processing) and the tree's two-way marginals plus any extra listed cliques. `fixed`: the
one-way marginals and the listed cliques. Each release is OpenDP's Gaussian (`gaussian_noise`);
together they charge mu^2 = sum (m sqrt(K_i) / sigma_i)^2 exactly (`workload_mu`). The record
count is never used: the pair scores take the noisy total.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from safeaccess.client.synthetic import SynthWorkload
from safeaccess.rules.dp.noise import gaussian_noise
from safeaccess.rules.synthetic import (
    SyntheticCheckError,
    max_spanning_tree,
    mst_sigmas,
    noisy_total,
    pair_scores,
    workload_mu,
)

FloatArray = NDArray[np.float64]
MST_SHARES = (0.25, 0.10, 0.65)
FIXED_SHARES = (0.25, 0.0, 0.75)


@dataclass(frozen=True)
class Measurement:
    clique: tuple[int, ...]
    values: FloatArray
    sigma: float


@dataclass(frozen=True)
class SynthMeasurements:
    """Everything released by the noise step (all public once the step is released)."""

    sigma_oneway: float
    sigma_selection: float | None
    sigma_cliques: float
    oneways: tuple[Measurement, ...]
    noisy_scores: FloatArray | None
    tree: tuple[tuple[int, int], ...]
    cliques: tuple[Measurement, ...]  # the tree's and the listed cliques
    total: float
    total_sd: float
    mu: float  # the GDP mu of the releases, recomputed from their sigmas

    @property
    def all(self) -> tuple[Measurement, ...]:
        return self.oneways + self.cliques


def _split(values: FloatArray, sizes: Sequence[int]) -> list[FloatArray]:
    return [np.asarray(v, dtype=np.float64) for v in np.split(values, np.cumsum(sizes)[:-1])]


def _noised(tables: Sequence[FloatArray], sigma: float) -> list[FloatArray]:
    if not tables:
        return []
    return _split(gaussian_noise(np.concatenate(tables), sigma), [t.size for t in tables])


def measure(
    work: SynthWorkload, tables: Sequence[ArrayLike], mu: float, records_per_unit: int
) -> SynthMeasurements:
    """Noise the exact `tables` (in `work.tables` order) at total privacy `mu`."""
    if len(tables) != len(work.tables):
        raise SyntheticCheckError(f"{len(tables)} exact tables for {len(work.tables)} cliques")
    exact = [np.asarray(t, dtype=np.float64) for t in tables]
    for clique, t in zip(work.tables, exact, strict=True):
        if t.size != work.cells(clique) or not np.all(np.isfinite(t)):
            raise SyntheticCheckError(f"exact table of clique {clique} has the wrong layout")
    d = len(work.columns)
    n_pairs = len(work.pairs)
    exact_ones = exact[:d]
    exact_pairs = exact[d : d + n_pairs]
    exact_extra = exact[d + n_pairs :]
    m = records_per_unit
    k = (d - 1 if work.method == "mst" else 0) + len(work.cliques)
    shares = MST_SHARES if work.method == "mst" else FIXED_SHARES
    s1, ss, s2 = mst_sigmas(mu, d, n_pairs, k, shares, records_per_unit=m)
    ones = _noised(exact_ones, s1)
    total, total_sd = noisy_total([o.sum() for o in ones], [o.size for o in ones], [s1] * d)
    noisy_scores: FloatArray | None = None
    tree: tuple[tuple[int, int], ...] = ()
    measured: list[tuple[tuple[int, ...], FloatArray]] = []
    if work.method == "mst":
        scores = pair_scores(exact_pairs, list(work.pairs), ones, total)
        noisy_scores = np.asarray(gaussian_noise(scores, ss), dtype=np.float64)
        tree = tuple(max_spanning_tree(d, list(work.pairs), noisy_scores))
        index = {p: i for i, p in enumerate(work.pairs)}
        measured += [(p, exact_pairs[index[p]]) for p in tree]
    measured += list(zip(work.cliques, exact_extra, strict=True))
    noisy_cliques = _noised([t for _, t in measured], s2) if measured else []
    sigmas = [s1] * d + ([ss] if work.method == "mst" else []) + [s2] * len(measured)
    cells = [1] * d + ([n_pairs] if work.method == "mst" else []) + [1] * len(measured)
    return SynthMeasurements(
        sigma_oneway=s1,
        sigma_selection=ss if work.method == "mst" else None,
        sigma_cliques=s2,
        oneways=tuple(Measurement((i,), v, s1) for i, v in enumerate(ones)),
        noisy_scores=noisy_scores,
        tree=tree,
        cliques=tuple(
            Measurement(c, v, s2) for (c, _), v in zip(measured, noisy_cliques, strict=True)
        ),
        total=total,
        total_sd=total_sd,
        mu=workload_mu(sigmas, cells, records_per_unit=m),
    )
