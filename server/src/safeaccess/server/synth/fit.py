"""Fit a graphical model to noisy marginals with Private-PGM (mbi >= 2.0) and sample records.

Pure post-processing of released measurements: the data never reach this module, only the noisy
marginal tables, their noise scales and the domain. The record count is estimated from the noisy
marginals (`noisy_total`), never taken from the data. The fit runs a fixed number of mirror-descent
iterations so that its run time does not depend on the data.

mbi 1.x is refused: its default "round" sampler correlates columns the model does not link.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from numpy.typing import NDArray

from safeaccess.rules.synthetic import noisy_total

# Before mbi is imported: float64 (float32 stalls the fit at large totals), CPU only, and no
# persistent compilation cache (mbi compiles many small programs; the cache only costs here).
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_enable_compilation_cache", False)

import mbi  # noqa: E402

DEFAULT_ITERATIONS = 1000
_MIN_MBI = (2, 0)


class SynthFitError(ValueError):
    """The measurements or the domain cannot be fitted; the message says what to fix."""


def _check_mbi_version() -> str:
    version = importlib.metadata.version("mbi")
    major_minor = tuple(int(p) for p in version.split(".")[:2])
    if major_minor < _MIN_MBI:
        raise ImportError(
            f"mbi {version} is installed but >= 2.0 is required (1.x's sampler correlates "
            "unlinked columns); install safeaccess-server[synth]"
        )
    return version


MBI_VERSION = _check_mbi_version()


@dataclass(frozen=True)
class NoisyMarginal:
    """A released marginal: the clique's column names, the noisy cell counts (flat, C order over
    the clique's columns in the listed order) and the Gaussian noise's standard deviation."""

    clique: tuple[str, ...]
    values: NDArray[np.float64]
    sigma: float


@dataclass(frozen=True)
class SynthFit:
    """The sampled records (level codes, columns in domain order), the estimated total, and the
    fitted model (for implied marginals via `model_marginal`)."""

    columns: tuple[str, ...]
    data: NDArray[np.int64]
    total: float
    total_sd: float
    model: Any


def fit_and_sample(
    domain: Mapping[str, int],
    measurements: Sequence[NoisyMarginal],
    *,
    rows: int | None = None,
    iterations: int = DEFAULT_ITERATIONS,
    seed: int | None = None,
) -> SynthFit:
    """Fit Private-PGM by mirror descent to `measurements` over `domain` (column -> levels) and
    sample `rows` records (default: the noisy total, rounded, at least 1).

    `seed` fixes the sampler (numpy's global generator, which mbi uses; restored afterwards).
    """
    columns = tuple(domain)
    if not columns:
        raise SynthFitError("the domain has no columns")
    levels = {c: int(domain[c]) for c in columns}
    if any(v < 1 for v in levels.values()):
        raise SynthFitError("every column needs at least one level")
    if not measurements:
        raise SynthFitError("no measurements: fit at least the one-way marginals")
    if iterations < 1:
        raise SynthFitError(f"iterations must be >= 1, got {iterations}")
    linear = []
    sums, cells, sigmas = [], [], []
    for m in measurements:
        unknown = [c for c in m.clique if c not in levels]
        if unknown or len(set(m.clique)) != len(m.clique) or not m.clique:
            raise SynthFitError(f"clique {m.clique}: columns must be distinct names of the domain")
        size = int(np.prod([levels[c] for c in m.clique]))
        values = np.asarray(m.values, dtype=np.float64).ravel()
        if values.size != size:
            raise SynthFitError(f"clique {m.clique}: {values.size} values for {size} cells")
        if not (np.isfinite(m.sigma) and m.sigma > 0):
            raise SynthFitError(f"clique {m.clique}: sigma must be finite and > 0")
        linear.append(mbi.LinearMeasurement(values, m.clique, stddev=float(m.sigma)))
        sums.append(float(values.sum()))
        cells.append(size)
        sigmas.append(float(m.sigma))
    total, total_sd = noisy_total(sums, cells, sigmas)
    n_rows = max(1, round(total)) if rows is None else int(rows)
    if n_rows < 1:
        raise SynthFitError(f"rows must be >= 1, got {rows}")
    mbi_domain = mbi.Domain(columns, [levels[c] for c in columns])
    model = mbi.estimation.MirrorDescent().estimate(
        mbi_domain, linear, known_total=max(total, 1.0), iters=iterations
    )
    state = np.random.get_state()
    try:
        if seed is not None:
            np.random.seed(seed)
        dataset = model.synthetic_data(n_rows, method="round")
    finally:
        np.random.set_state(state)
    records = dataset.to_dict()
    data = np.stack([np.asarray(records[c], dtype=np.int64) for c in columns], axis=1)
    return SynthFit(columns, data, total, total_sd, model)


def model_marginal(fit: SynthFit, clique: Sequence[str]) -> NDArray[np.float64]:
    """The fitted model's marginal over `clique` as probabilities (axes in the clique's order)."""
    factor = fit.model.project(tuple(clique))
    table = np.asarray(factor.datavector(flatten=False), dtype=np.float64)
    return table / table.sum()
