"""Exact nearest real row per query by median-split cells and blocked matrix products.

At dimension 8 to 10 on spread-out data a k-d tree proves each nearest neighbour by walking
hundreds of nodes per query (scipy's, sklearn's and pykdtree's all take some 40-60 us a query at
d = 10, 100 000 x 100 000). Here the real rows are grouped by which side of each column's
median they lie on (2^d cells at most); a lower bound on the distance from every query to every
cell is one matrix product, because the bound is a sum over the columns where the cell lies on
the other side of the median; only the cells within the distance of an approximate neighbour
(a cheap `eps` k-d tree query) are measured, cell by cell, with one matrix product per cell.
Products are rounded, so every row within a rigorous error bound of the smallest is measured
again exactly (`_norms`, as `dcr` reports), and ties resolve to the lowest index as in `dcr`.

No library offers this (an exact, tie-aware blocked search with a pruning bound that is itself a
matrix product): scipy and sklearn have trees only, and faiss's exact search is brute force in
float32. When the bounds prune too little (data spanned by few directions, whose rows crowd into
a few cells) `nearest_by_cells` says so and the caller uses its k-d tree.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from scipy.spatial import cKDTree
from threadpoolctl import ThreadpoolController

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# Measured on 100 000 x 100 000 (benchmarks/synthetic.py --only-dcr): one query-row distance
# inside a cell costs a few ns, a k-d tree query at d = 10 some 40-60 us. Uniform data at d = 10
# measure about 4 % of the real rows per query (3x faster than the tree); data spanned by 3
# directions in 10 columns some 13 % (the tree is faster there). Above this share the caller's
# tree answers.
MAX_SHARE = 0.08
# eps of the approximate first search: its neighbour is at most (1 + eps) times farther than the
# nearest; 2 costs a sixteenth of an exact query and keeps the bound within 2 % on average.
APPROX_EPS = 2.0
_TIE_RTOL = 1e-12
_QUERY_CHUNK = 4096
# One BLAS thread for the products: each is small (a cell's rows by its queries) and a
# multi-threaded BLAS spends more on waking and syncing threads than on the product (some 4x
# more CPU at d = 10); see also safeaccess.rules.qss.admit.
_BLAS = ThreadpoolController()
_EPS = float(np.finfo(np.float64).eps)


def nearest_by_cells(
    s: FloatArray,
    uniq: FloatArray,
    first: IntArray,
    tree: cKDTree,
    workers: int,
    max_share: float | None = None,
) -> IntArray | None:
    """For each row of `s`, `first[j]` of its nearest row j of `uniq` (distinct rows; `first`
    their lowest indices in the caller's data, so ties between equally close rows resolve to
    the lowest index), or None when the cells would measure more than `max_share` (by
    default MAX_SHARE) of the rows of `uniq` per query on average (the caller's k-d tree is then faster). `tree` is a k-d tree over
    `uniq`; `workers` its query threads, as scipy counts them."""
    # (the limit is process-wide: other threads' products run single-threaded meanwhile, which
    # changes their speed, never their result)
    with _BLAS.limit(limits=1, user_api="blas"):
        return _nearest(
            s, uniq, first, tree, workers, MAX_SHARE if max_share is None else max_share
        )


def _nearest(
    s: FloatArray,
    uniq: FloatArray,
    first: IntArray,
    tree: cKDTree,
    workers: int,
    max_share: float,
) -> IntArray | None:
    n, d = s.shape
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    # Queries in the leaf order of a k-d tree over themselves: neighbouring queries visit the
    # same tree nodes and the same cells, so both stay in cache.
    walk = cKDTree(s).indices if n > 1 else np.zeros(n, dtype=np.int64)
    sq = s[walk]
    _, approx_idx = tree.query(sq, k=1, eps=APPROX_EPS, workers=workers)
    approx = np.asarray(approx_idx, dtype=np.int64).reshape(n)
    diff = sq - uniq[approx]
    # the approximate neighbour's squared distance bounds the nearest one's from above
    u2 = np.einsum("ij,ij->i", diff, diff)

    cut = np.median(uniq, axis=0)
    code = (uniq >= cut) @ (np.int64(1) << np.arange(d, dtype=np.int64))
    order = np.argsort(code, kind="stable")
    cells, starts, counts = np.unique(code[order], return_index=True, return_counts=True)
    high = ((cells[:, None] >> np.arange(d)) & 1).astype(np.float64)  # cell x column
    visits = _visits(sq, cut, high, u2)
    if float(sum(v.size * int(k) for v, k in zip(visits, counts, strict=True))) > (
        max_share * uniq.shape[0] * n
    ):
        return None

    # Centred coordinates shrink the products' rounding; [-2 q, 1] . [p, |p|^2] is
    # |q - p|^2 - |q|^2, enough to rank the rows for a query.
    rows = uniq[order]
    centre = (rows.min(axis=0) + rows.max(axis=0)) / 2.0
    sc, rc = sq - centre, rows - centre
    q_aug = np.ascontiguousarray(np.c_[-2.0 * sc, np.ones(n)].T)  # (d + 1) x n
    r_aug = np.c_[rc, np.einsum("ij,ij->i", rc, rc)]  # rows x (d + 1)
    q_norm2 = np.einsum("ij,ij->i", sc, sc)
    # |computed - exact| of one product entry (d + 1 terms of magnitude up to 2|q||p| + |p|^2)
    err = 4.0 * (d + 2) * _EPS * (np.sqrt(q_norm2) + math.sqrt(float(r_aug[:, -1].max()))) ** 2

    best = np.full(n, np.inf)
    cell_min: list[FloatArray] = []
    for c, queries in enumerate(visits):
        low = _products(r_aug, starts[c], counts[c], q_aug, queries).min(axis=0, initial=np.inf)
        best[queries] = np.minimum(best[queries], low)
        cell_min.append(low)

    # Every row whose exact value is within the tie tolerance of the smallest has a computed
    # value within 2 err (plus that tolerance) of the smallest computed one.
    ties = 4.0 * _TIE_RTOL * np.maximum(best + q_norm2, 0.0)
    cut_off = best + 2.0 * err + ties
    pair_q: list[IntArray] = [np.arange(n, dtype=np.int64)]
    pair_r: list[IntArray] = [approx]  # the approximate neighbour is always a candidate
    for c, queries in enumerate(visits):
        again = queries[cell_min[c] <= cut_off[queries]]
        if again.size == 0:
            continue
        block = _products(r_aug, starts[c], counts[c], q_aug, again)
        hit_r, hit_q = np.nonzero(block <= cut_off[again])
        pair_q.append(again[hit_q])
        pair_r.append(order[starts[c] + hit_r])
    qs, rs = np.concatenate(pair_q), np.concatenate(pair_r)
    exact = sq[qs] - uniq[rs]
    dist = np.sqrt(np.einsum("ij,ij->i", exact, exact))
    nearest = np.full(n, np.inf)
    np.minimum.at(nearest, qs, dist)
    tied = dist <= nearest[qs] * (1.0 + _TIE_RTOL)
    index = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(index, qs[tied], first[rs[tied]])
    out = np.empty(n, dtype=np.int64)
    out[walk] = index
    return out


def _visits(s: FloatArray, cut: FloatArray, high: FloatArray, u2: FloatArray) -> list[IntArray]:
    """For each cell, the queries (ascending) whose approximate neighbour is not nearer than the
    cell's lower bound.

    The squared distance from query q to a row of cell c is at least the sum, over the columns
    where c lies on the other side of the median, of (q_j - cut_j)^2: a product of the cells'
    side bits with per-query weights. Rounding is allowed for by a relative 1e-9 on q's bound
    and an absolute multiple of eps. Queries go in chunks, so the cells x queries bounds stay
    small."""
    n, d = s.shape
    found_c: list[IntArray] = []
    found_q: list[IntArray] = []
    for start in range(0, n, _QUERY_CHUNK):
        q = s[start : start + _QUERY_CHUNK]
        side = (q >= cut).astype(np.float64)
        w = (q - cut) ** 2
        bound = high @ np.ascontiguousarray((w * (1.0 - 2.0 * side)).T)
        limit = u2[start : start + q.shape[0]] * (1.0 + 1e-9) + 8.0 * (d + 1) * _EPS * w.sum(1)
        cell, query = np.nonzero(bound <= (limit - np.einsum("ij,ij->i", w, side))[None, :])
        found_c.append(cell)
        found_q.append(query + start)
    cell_all, query_all = np.concatenate(found_c), np.concatenate(found_q)
    # each chunk's pairs come sorted by cell: a stable sort merges the runs, queries ascending
    by_cell = np.argsort(cell_all, kind="stable")
    edges = np.r_[0, np.cumsum(np.bincount(cell_all, minlength=high.shape[0]))]
    query_sorted = query_all[by_cell]
    return [query_sorted[edges[c] : edges[c + 1]] for c in range(high.shape[0])]


def _products(
    r_aug: FloatArray, start: int, count: int, q_aug: FloatArray, queries: IntArray
) -> FloatArray:
    """|q - p|^2 - |q|^2 (rounded) for the cell's rows p (rows of the result) and `queries`
    (columns): rows x queries, so the minimum over rows is an element-wise one."""
    return np.asarray(r_aug[start : start + count] @ q_aug[:, queries], dtype=np.float64)
