"""Chen's distance to closest record (DCR, Alg. 2 / y-privacy) and its leave-one-out reference.

Distances are Euclidean on features built by `distance_features`: numeric columns scaled to
[0, 1] by their declared bounds, a categorical column contributing 1 to the squared distance
when the codes differ (one-hot / sqrt 2). A k-d tree answers nearest-neighbour queries up to
dimension 10; above that k-d trees degrade to brute force, so chunked exact distances are used
(and `dcr_report` measures a sample of at most 10 000 records per side).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

from safeaccess.rules.synthetic.cells import crowded, nearest_by_cells
from safeaccess.rules.synthetic.coding import row_ids
from safeaccess.rules.synthetic.errors import SyntheticCheckError
from safeaccess.rules.synthetic.gcap import gcap, gcap_loo

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

KD_TREE_MAX_DIM = 10
BRUTE_FORCE_SAMPLE = 10_000
_CHUNK = 1024
_TIE_NEIGHBOURS = 8
_TIE_RTOL = 1e-12
# Leaf size of the real records' k-d tree: 32 points per leaf instead of scipy's 16 takes about
# 15 % less CPU at d = 10 (uniform, 100 k x 100 k) and the same at d = 5 and on data with few
# latent dimensions (`benchmarks/synthetic.py --only-dcr`); the answers do not depend on it.
KD_LEAFSIZE = 32
# `dcr_report` only needs the distances up to their median (and the LOO ones up to their 5 %
# quantile): a search bounded a little above those, placed by an exact pilot on a sample, is
# exact for every record it finds and far cheaper (see `_smallest_exactly`).
_PILOT = 2_000
_BOUND_SLACK = 1e-9
# From this dimension and this many query x distinct real rows on, `dcr` first tries the cell
# search (`cells.nearest_by_cells`), which is exact and some 3x faster than the k-d tree at
# d = 10 on spread-out data; it declines (and the tree answers) when its bounds prune too little.
# Below dimension 8 the k-d tree is fast and the cells (2^d of them) prune badly.
CELLS_MIN_DIM = 8
CELLS_MIN_PAIRS = 10**8


def distance_features(data: ArrayLike, columns: Sequence[tuple[float, float] | int]) -> FloatArray:
    """Features whose Euclidean distance is the check's record distance.

    `columns[i]` is `(lower, upper)` for a numeric column (scaled to (x - lower) / (upper -
    lower)) or an int L for a categorical column coded 0..L-1 (one-hot divided by sqrt 2, so two
    different codes are at distance 1).
    """
    arr = np.asarray(data, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != len(columns):
        raise SyntheticCheckError(
            f"data must be records x {len(columns)} columns, got shape {arr.shape}"
        )
    parts: list[FloatArray] = []
    for i, spec in enumerate(columns):
        col = arr[:, i]
        if isinstance(spec, tuple):
            lower, upper = float(spec[0]), float(spec[1])
            if not (math.isfinite(lower) and math.isfinite(upper) and upper > lower):
                raise SyntheticCheckError(f"column {i}: bounds must satisfy lower < upper")
            parts.append(((col - lower) / (upper - lower))[:, None])
            continue
        levels = int(spec)
        if levels < 1:
            raise SyntheticCheckError(f"column {i}: a categorical column needs >= 1 level")
        codes = col.astype(np.int64)
        if np.any(codes != col) or np.any((codes < 0) | (codes >= levels)):
            raise SyntheticCheckError(f"column {i}: codes must be integers in 0..{levels - 1}")
        onehot = np.zeros((arr.shape[0], levels))
        onehot[np.arange(arr.shape[0]), codes] = 1.0 / math.sqrt(2.0)
        parts.append(onehot)
    if not parts:
        return np.zeros((arr.shape[0], 0))
    return np.concatenate(parts, axis=1)


def dcr(syn: ArrayLike, real: ArrayLike) -> tuple[FloatArray, IntArray]:
    """Distance from each synthetic record to its closest real record, and that record's index
    (the lowest index among equally close real records)."""
    s, r = as_features(syn, "syn"), as_features(real, "real")
    if s.shape[1] != r.shape[1]:
        raise SyntheticCheckError(f"syn has {s.shape[1]} features but real has {r.shape[1]}")
    if r.shape[0] == 0:
        raise SyntheticCheckError("real has no records: DCR needs at least one")
    if s.shape[1] <= KD_TREE_MAX_DIM:
        index = _nearest_exact(s, r)
    else:
        index = _nearest_brute(s, r, exclude=None)
    return _norms(s - r[index]), index


def _nearest_exact(s: FloatArray, r: FloatArray) -> IntArray:
    """`_nearest_kdtree(s, r)` (same indices), by the cell search where that is faster."""
    prep = _real_tree(r)
    index = _by_cells(s, prep)
    return _nearest_kdtree(s, prep) if index is None else index


def _by_cells(s: FloatArray, prep: _RealTree) -> IntArray | None:
    """`_nearest_kdtree(s, prep)` by the cell search, or None where the tree is faster."""
    if (
        s.shape[1] >= CELLS_MIN_DIM
        and s.shape[0] * prep.uniq.shape[0] >= CELLS_MIN_PAIRS
        and prep.uniq.shape[0] > 1
    ):
        return nearest_by_cells(s, prep.uniq, prep.first, prep.tree, _workers())
    return None


def dcr_loo(real: ArrayLike, rows: ArrayLike | None = None) -> tuple[FloatArray, IntArray]:
    """Distance from each real record (or each of the records `rows`) to its closest *other*
    real record (a duplicate counts, at distance 0), and that record's index."""
    r = as_features(real, "real")
    if r.shape[0] < 2:
        raise SyntheticCheckError("the leave-one-out distance needs at least 2 real records")
    own = np.arange(r.shape[0]) if rows is None else np.asarray(rows, dtype=np.int64)
    if own.ndim != 1 or np.any((own < 0) | (own >= r.shape[0])):
        raise SyntheticCheckError(f"rows must be indices 0..{r.shape[0] - 1} of real")
    if r.shape[1] <= KD_TREE_MAX_DIM:
        _, idx = _query(cKDTree(r, leafsize=KD_LEAFSIZE), r[own], 2)
        # with duplicates the tree may list the twin first; the other neighbour is then self
        index = np.where(idx[:, 0] != own, idx[:, 0], idx[:, 1]).astype(np.int64)
    else:
        index = _nearest_brute(r[own], r, exclude=own)
    return _norms(r[own] - r[index]), index


@dataclass(frozen=True)
class DcrReport:
    """y-privacy (min and median DCR), DCR quantiles, and the share of synthetic records closer
    than the 5 % quantile of the real-to-real LOO distances, against the real records' own share."""

    y_privacy_min: float
    y_privacy_median: float
    quantiles: dict[str, float]
    threshold: float
    p_syn: float
    p_ref: float
    z: float
    exact_copy_share: float


def hamming_dcr(
    syn_codes: ArrayLike, real_codes: ArrayLike, levels: Sequence[int]
) -> tuple[FloatArray, FloatArray]:
    """DCR and LOO distances when every column is categorical, exactly and on all records.

    With one-hot / sqrt 2 features (`distance_features` with an int per column) the squared
    distance of two records is the number of columns where their codes differ, so the nearest
    record is the one at the smallest Hamming distance: GCAP's shell search over all columns
    (sort-joins of unique packed rows) finds it without the n_syn x n_real distance matrix that
    brute force needs above dimension 10. Returns (sqrt of each synthetic record's Hamming
    distance to its closest real record, the same for each real record to its closest other).
    """
    s = np.asarray(syn_codes, dtype=np.int64)
    r = np.asarray(real_codes, dtype=np.int64)
    if s.ndim != 2 or r.ndim != 2 or s.shape[1] != r.shape[1] or s.shape[1] != len(levels):
        raise SyntheticCheckError("syn_codes and real_codes must be records x len(levels)")
    _, rho = gcap(s, np.zeros(len(s), np.int64), r, np.zeros(len(r), np.int64), levels, 1)
    _, loo = gcap_loo(r, np.zeros(len(r), np.int64), levels, 1)
    return np.sqrt(rho.astype(np.float64)), np.sqrt(loo.astype(np.float64))


def dcr_report(
    syn: ArrayLike,
    real: ArrayLike,
    *,
    quantile: float = 0.05,
    sample: int = BRUTE_FORCE_SAMPLE,
    seed: int = 0,
    distances: tuple[ArrayLike, ArrayLike] | None = None,
) -> DcrReport:
    """DCR of S against O, compared with the LOO distances of O (threshold = their `quantile`).

    Above dimension 10 (no k-d tree), at most `sample` synthetic records and as many real
    records (drawn with `seed`) are measured, each against all real records. `distances` =
    (DCR of every synthetic record, LOO distance of every real record), when the caller has them
    (`hamming_dcr` for all-categorical records), replaces the search.
    `z` is the one-sided binomial z of p_syn against p_ref over the measured synthetic records;
    the exact copy share counts all synthetic rows equal to a real row (row equality, not a
    distance)."""
    s_all, r = as_features(syn, "syn"), as_features(real, "real")
    if not 0.0 < quantile < 1.0:
        raise SyntheticCheckError(f"quantile must lie strictly between 0 and 1, got {quantile}")
    if s_all.shape[0] == 0:
        raise SyntheticCheckError("syn has no records")
    s, rows = s_all, None
    if distances is not None:
        dist = np.asarray(distances[0], dtype=np.float64)
        loo = np.asarray(distances[1], dtype=np.float64)
        if dist.shape != (s_all.shape[0],) or loo.shape != (r.shape[0],):
            raise SyntheticCheckError("distances must hold one entry per syn and real record")
    else:
        if r.shape[1] > KD_TREE_MAX_DIM:
            rng = np.random.default_rng(seed)
            if s_all.shape[0] > sample:
                s = s_all[np.sort(rng.choice(s_all.shape[0], size=sample, replace=False))]
            if r.shape[0] > sample:
                rows = np.sort(rng.choice(r.shape[0], size=sample, replace=False))
            dist, _ = dcr(s, r)
            loo, _ = dcr_loo(r, rows)
        else:
            # Only the distances up to the median (and the LOO ones up to their `quantile`) enter
            # the report, so bounded searches give exactly the values the full ones would.
            if s.shape[1] != r.shape[1]:
                raise SyntheticCheckError(
                    f"syn has {s.shape[1]} features but real has {r.shape[1]}"
                )
            if r.shape[0] < 2:
                raise SyntheticCheckError(
                    "the leave-one-out distance needs at least 2 real records"
                )
            loo = _loo_smallest(r, quantile, seed)
            floor = float(np.quantile(loo, quantile))
            dist = _dcr_smallest(s, r, 0.5, floor, seed)
    threshold = float(np.quantile(loo, quantile))
    p_syn = float(np.mean(dist <= threshold))
    p_ref = float(np.mean(loo <= threshold))
    sd = math.sqrt(p_ref * (1.0 - p_ref) / dist.shape[0])
    z = (p_syn - p_ref) / sd if sd > 0 else (math.inf if p_syn > p_ref else 0.0)
    s_ids, r_ids = row_ids(_exact(s_all), _exact(r))
    copies = float(np.isin(s_ids, r_ids).mean())
    q = np.quantile(dist, [0.01, 0.05, 0.5])
    return DcrReport(
        y_privacy_min=float(dist.min()),
        y_privacy_median=float(np.median(dist)),
        quantiles={"q01": float(q[0]), "q05": float(q[1]), "q50": float(q[2])},
        threshold=threshold,
        p_syn=p_syn,
        p_ref=p_ref,
        z=z,
        exact_copy_share=copies,
    )


def _dcr_smallest(
    s: FloatArray, r: FloatArray, fraction: float, floor: float, seed: int
) -> FloatArray:
    """`dcr(s, r)[0]` exactly for the smallest distances (see `_smallest_exactly`), inf above."""
    prep = _real_tree(r)
    index = _by_cells(s, prep)
    if index is not None:
        # every distance, exactly, in less time than the bounded tree search (d = 10,
        # uniform: 1.8 s against 5 s CPU)
        return _norms(s - r[index])

    def measure(points: FloatArray, bound: float = math.inf) -> FloatArray:
        index = _nearest_kdtree(points, prep, bound)
        out = np.full(points.shape[0], math.inf)
        ok = index >= 0
        out[ok] = _norms(points[ok] - r[index[ok]])
        return out

    return _smallest_exactly(
        s.shape[0],
        fraction,
        floor,
        seed,
        pilot=lambda rows: measure(s[rows]),
        below=lambda bound: _kept_below(measure(s, bound), bound),
        full=lambda: measure(s),
    )


def _loo_smallest(r: FloatArray, fraction: float, seed: int) -> FloatArray:
    """`dcr_loo(r)[0]` exactly for the smallest distances (see `_smallest_exactly`), inf above."""
    by_cells = _loo_by_cells(r)
    if by_cells is not None:
        return by_cells  # every distance, exactly (d = 10, uniform: 1.7 s against 2.7 s CPU)
    tree = cKDTree(r, leafsize=KD_LEAFSIZE)

    def measure(own: IntArray, bound: float = math.inf) -> FloatArray:
        _, idx = _query(tree, r[own], 2, bound)
        # with duplicates the tree may list the twin first; the other neighbour is then self
        other = np.where(idx[:, 0] != own, idx[:, 0], idx[:, 1])
        out = np.full(own.shape[0], math.inf)
        ok = other < r.shape[0]  # beyond the bound scipy answers index n
        out[ok] = _norms(r[own[ok]] - r[other[ok]])
        return out

    every = np.arange(r.shape[0])
    return _smallest_exactly(
        r.shape[0],
        fraction,
        0.0,
        seed,
        pilot=measure,
        below=lambda bound: _kept_below(measure(every, bound), bound),
        full=lambda: measure(every),
    )


def _loo_by_cells(r: FloatArray) -> FloatArray | None:
    """`dcr_loo(r)[0]` by the cell search (every distance exact), or None where the k-d tree is
    faster: a row with a twin is at distance 0, every other row's nearest other distinct row
    is searched with the row itself excluded."""
    if r.shape[1] < CELLS_MIN_DIM or r.shape[0] * r.shape[0] < CELLS_MIN_PAIRS or crowded(r):
        return None
    uniq, first, inverse, counts = np.unique(
        r, axis=0, return_index=True, return_inverse=True, return_counts=True
    )
    if uniq.shape[0] < 2:
        return None
    own = inverse.reshape(-1).astype(np.int64)
    single = counts[own] == 1
    tree = cKDTree(uniq, leafsize=KD_LEAFSIZE)
    index = nearest_by_cells(
        r[single], uniq, first.astype(np.int64), tree, _workers(), exclude=own[single]
    )
    if index is None:
        return None
    out = np.zeros(r.shape[0])
    out[single] = _norms(r[single] - r[index])
    return out


@dataclass(frozen=True)
class _RealTree:
    """The unique real rows, the lowest index of each, and their k-d tree."""

    uniq: FloatArray
    first: IntArray
    tree: cKDTree


def _real_tree(r: FloatArray) -> _RealTree:
    # Equal real rows collapse to their first (lowest) index, so ties between copies resolve.
    uniq, first = np.unique(r, axis=0, return_index=True)
    return _RealTree(uniq, first.astype(np.int64), cKDTree(uniq, leafsize=KD_LEAFSIZE))


def _nearest_kdtree(s: FloatArray, r: FloatArray | _RealTree, bound: float = math.inf) -> IntArray:
    """Index of each query's nearest real row (lowest index among ties). With a finite `bound`,
    -1 for every query whose nearest row lies farther than bound / (1 + _BOUND_SLACK); the
    others are exact: a row tied with the nearest one lies within bound, so the bounded query
    still lists it as the second neighbour."""
    prep = r if isinstance(r, _RealTree) else _real_tree(r)
    uniq, first, tree = prep.uniq, prep.first, prep.tree
    if uniq.shape[0] == 1:
        return np.zeros(s.shape[0], dtype=np.int64) + int(first[0])
    # Two neighbours tell a unique nearest row from a tie; only tied rows are asked for more
    # (a tree query's cost grows with k, steeply in higher dimensions).
    dist, idx = _query(tree, s, 2, bound)
    found = dist[:, 0] <= bound / (1.0 + _BOUND_SLACK)
    index = np.full(s.shape[0], -1, dtype=np.int64)
    index[found] = first[idx[found, 0]]
    tied = np.flatnonzero(found & (dist[:, 1] <= dist[:, 0] * (1.0 + _TIE_RTOL)))
    if tied.size == 0:
        return index
    kk = min(_TIE_NEIGHBOURS, uniq.shape[0])
    dist_t, idx_t = _query(tree, s[tied], kk)
    best = dist_t[:, :1]
    close = dist_t <= best * (1.0 + _TIE_RTOL)
    index[tied] = np.where(close, first[idx_t], np.iinfo(np.int64).max).min(axis=1)
    # all kk neighbours tied: more equally close rows may lie beyond them
    for i in np.flatnonzero(close[:, -1] & (kk < uniq.shape[0])):
        point = s[tied[i]]
        cand = np.asarray(tree.query_ball_point(point, best[i, 0] * (1.0 + 1e-9) + 1e-300))
        d = _norms(uniq[cand] - point)
        index[tied[i]] = first[cand[d <= d.min() * (1.0 + _TIE_RTOL)]].min()
    return index


def _query(
    tree: cKDTree, points: FloatArray, k: int, bound: float = math.inf
) -> tuple[FloatArray, IntArray]:
    """`tree.query(points, k, distance_upper_bound=bound)`, exact as ever, but faster: the points
    are asked in the leaf order of a k-d tree over themselves (neighbouring queries walk the same
    nodes, so they stay in cache; about 20-30 % less CPU on uniform data at d = 10) and on
    `_workers()` threads. Missing neighbours (beyond `bound`) come back at distance inf."""
    if points.shape[0] < 2:
        dist, idx = tree.query(points, k=k, distance_upper_bound=bound)
        return np.asarray(dist).reshape(points.shape[0], k), np.asarray(idx).reshape(-1, k)
    order = cKDTree(points).indices
    dist_o, idx_o = tree.query(points[order], k=k, workers=_workers(), distance_upper_bound=bound)
    dist = np.empty((points.shape[0], k))
    idx = np.empty((points.shape[0], k), dtype=np.int64)
    dist[order] = np.asarray(dist_o).reshape(-1, k)
    idx[order] = np.asarray(idx_o).reshape(-1, k)
    return dist, idx


def _kept_below(dist: FloatArray, bound: float) -> FloatArray:
    """`dist` with every value above bound * (1 - 2 * _BOUND_SLACK) set to inf.

    A record the bounded search did not find has a tree distance above bound / (1 +
    _BOUND_SLACK), so its exact distance (a few ulps away) is above this cut too: the finite
    values left are exactly the records at or below the cut, with the unbounded search's values.
    """
    out = dist.copy()
    out[~(out <= bound * (1.0 - 2.0 * _BOUND_SLACK))] = math.inf
    return out


def _smallest_exactly(
    n: int,
    fraction: float,
    floor: float,
    seed: int,
    pilot: Callable[[IntArray], FloatArray],
    below: Callable[[float], FloatArray],
    full: Callable[[], FloatArray],
) -> FloatArray:
    """Distances of `n` records, exact for the smallest: at least enough of them for every
    quantile up to `fraction` (np.quantile reads the values at ranks floor(f * (n - 1)) and the
    next one) and every record at or below `floor`; the others may be inf.

    `pilot(rows)` measures a sample exactly; its quantile at fraction + 0.1 (some 9 standard
    errors above the wanted one at 2 000 records) places the bound of `below(bound)`. If that
    search keeps too few records, `full()` measures all of them: the result is exact either way,
    only the time depends on the pilot.
    """
    need = math.floor(fraction * (n - 1)) + 2
    if n <= 4 * _PILOT or fraction + 0.1 >= 1.0:
        return full()
    rng = np.random.default_rng(seed)
    est = pilot(np.sort(rng.choice(n, size=_PILOT, replace=False)))
    bound = max(float(np.quantile(est, fraction + 0.1)), floor) * (1.0 + 4.0 * _BOUND_SLACK)
    if not (math.isfinite(bound) and bound > 0.0):
        return full()
    dist = below(bound)
    if int(np.count_nonzero(np.isfinite(dist))) < need or not floor <= bound * (
        1.0 - 2.0 * _BOUND_SLACK
    ):
        return full()
    return dist


def _workers() -> int:
    # The sandbox sizes thread pools by OMP_NUM_THREADS (1 under the process sandbox, whose task
    # limit counts threads; the CPU quota under Docker); elsewhere every core (-1).
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else -1


def _nearest_brute(s: FloatArray, r: FloatArray, *, exclude: IntArray | None) -> IntArray:
    """Exact nearest real row per query row in chunks; `exclude[i]` is a real row query i may
    not take (itself, for the LOO distance)."""
    out = np.empty(s.shape[0], dtype=np.int64)
    for start in range(0, s.shape[0], _CHUNK):
        block = cdist(s[start : start + _CHUNK], r, "sqeuclidean")
        if exclude is not None:
            block[np.arange(block.shape[0]), exclude[start : start + block.shape[0]]] = np.inf
        out[start : start + block.shape[0]] = np.argmin(block, axis=1)  # first = lowest index
    return out


def _norms(diff: FloatArray) -> FloatArray:
    return np.sqrt(np.einsum("ij,ij->i", diff, diff))


def as_features(values: ArrayLike, name: str) -> FloatArray:
    """`values` as a finite float matrix (records x features)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2:
        raise SyntheticCheckError(f"{name} must be a 2-D array (records x features)")
    if not np.all(np.isfinite(arr)):
        raise SyntheticCheckError(f"{name} must hold finite numbers")
    return arr


def _exact(arr: FloatArray) -> NDArray[np.int64]:
    # the float bit patterns as integers: equal rows compare equal with no float tolerance
    return (arr + 0.0).view(np.int64)
