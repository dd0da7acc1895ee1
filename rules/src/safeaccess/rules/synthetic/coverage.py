"""Chen's (y,p)-coverage (Alg. 1): a minimum-weight matching of synthetic to real records.

scipy's `linear_sum_assignment` (shortest augmenting path) is O(m^3) time and O(m^2) memory, so
the matching runs on samples of at most 5 000 records per side; the nearest-neighbour count on
all records (every synthetic record may take the same real record) bounds it from above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist

from safeaccess.rules.synthetic.distance import FloatArray, as_features, dcr
from safeaccess.rules.synthetic.errors import SyntheticCheckError

HUNGARIAN_MAX = 5000


@dataclass(frozen=True)
class Coverage:
    """omega: matched distances per synthetic record (Hungarian only); zeta = |{omega <= y}|;
    p_prime = zeta / m; fulfilled iff p_prime <= p. `matched_real[i]` is the real record matched
    to synthetic record `matched_syn[i]` (Hungarian) or its nearest real record (nearest)."""

    omega: FloatArray | None
    zeta: int
    p_prime: float
    fulfilled: bool
    matched_syn: NDArray[np.int64]
    matched_real: NDArray[np.int64]

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)


@dataclass(frozen=True)
class SampledCoverage:
    """(y,p)-coverage on `repeats` samples of m records per side, and on all records by NN."""

    m: int
    p_primes: tuple[float, ...]
    p_prime_mean: float
    p_prime_max: float
    p_prime_nearest: float
    fulfilled: bool  # on the mean of the samples


def yp_coverage(
    real: ArrayLike,
    syn: ArrayLike,
    y: float,
    p: float,
    method: Literal["hungarian", "nearest"] = "hungarian",
    *,
    max_size: int = HUNGARIAN_MAX,
) -> Coverage:
    """Whether S fulfils (y,p)-coverage against O (features as from `distance_features`).

    "hungarian": minimum-weight matching on Euclidean distances (rectangular when the sizes
    differ: min(n_O, n_S) pairs); refused above `max_size` records per side - sample first.
    "nearest": every synthetic record against its closest real record, on all records.
    """
    r, s = as_features(real, "real"), as_features(syn, "syn")
    if r.shape[1] != s.shape[1]:
        raise SyntheticCheckError(f"real has {r.shape[1]} features but syn has {s.shape[1]}")
    if r.shape[0] == 0 or s.shape[0] == 0:
        raise SyntheticCheckError("(y,p)-coverage needs records on both sides")
    if not (np.isfinite(y) and y >= 0):
        raise SyntheticCheckError(f"y must be a finite distance >= 0, got {y!r}")
    if not 0.0 <= p <= 1.0:
        raise SyntheticCheckError(f"p must lie in [0, 1], got {p!r}")
    if method == "nearest":
        dist, nearest = dcr(s, r)
        zeta = int(np.sum(dist <= y))
        p_prime = zeta / s.shape[0]
        return Coverage(None, zeta, p_prime, p_prime <= p, np.arange(s.shape[0]), nearest)
    if method != "hungarian":
        raise SyntheticCheckError(f"method must be 'hungarian' or 'nearest', got {method!r}")
    if max(r.shape[0], s.shape[0]) > max_size:
        raise SyntheticCheckError(
            f"the matching is limited to {max_size} records per side (O(m^3) time, O(m^2) "
            f"memory); got {r.shape[0]} real and {s.shape[0]} synthetic: sample them first"
        )
    cost = cdist(s, r)
    rows, cols = linear_sum_assignment(cost)
    omega = cost[rows, cols]
    zeta = int(np.sum(omega <= y))
    p_prime = zeta / omega.size
    return Coverage(
        omega, zeta, p_prime, p_prime <= p, rows.astype(np.int64), cols.astype(np.int64)
    )


def yp_coverage_sampled(
    real: ArrayLike,
    syn: ArrayLike,
    y: float,
    p: float,
    *,
    m: int = HUNGARIAN_MAX,
    repeats: int = 3,
    seed: int = 0,
    nearest: ArrayLike | None = None,
) -> SampledCoverage:
    """Hungarian (y,p)-coverage on `repeats` samples of min(n_O, n_S, m) records from each side,
    plus the nearest-neighbour p' on all records. `nearest`, when the caller has it, is every
    synthetic record's distance to its closest real record (the DCR), which spares the
    nearest-neighbour search (brute force above dimension 10)."""
    r, s = as_features(real, "real"), as_features(syn, "syn")
    if repeats < 1 or m < 1:
        raise SyntheticCheckError("repeats and m must be >= 1")
    size = min(r.shape[0], s.shape[0], m)
    rng = np.random.default_rng(seed)
    p_primes = []
    for _ in range(repeats):
        ri = rng.choice(r.shape[0], size=size, replace=False)
        si = rng.choice(s.shape[0], size=size, replace=False)
        p_primes.append(yp_coverage(r[ri], s[si], y, p, max_size=size).p_prime)
    if nearest is None:
        p_nearest = yp_coverage(r, s, y, p, method="nearest").p_prime
    else:
        dist = np.asarray(nearest, dtype=np.float64)
        if dist.shape != (s.shape[0],):
            raise SyntheticCheckError("nearest must hold one distance per synthetic record")
        p_nearest = float(np.mean(dist <= y))
    mean = float(np.mean(p_primes))
    return SampledCoverage(size, tuple(p_primes), mean, max(p_primes), p_nearest, mean <= p)
