"""Exact nearest real row per query by median-split cells and blocked matrix products.

At dimension 8 to 10 on spread-out data a k-d tree proves each nearest neighbour by walking
hundreds of nodes per query (scipy's, sklearn's and pykdtree's all take some 40-60 us a query at
d = 10, 100 000 x 100 000). Here the real rows are grouped by which side of each column's
median they lie on (2^d cells at most); a lower bound on the distance from every query to every
cell is one matrix product, because the bound is a sum over the columns where the cell lies on
the other side of the median; only the cells within the distance of an approximate neighbour
(a cheap `eps` k-d tree query) are measured, cell by cell, with one matrix product per cell.
Bounds and products are float32 with their rounding bounded: no cell that could hold the
nearest row is skipped, and every row within the products' error bound of the smallest is
measured again exactly in float64 (as `dcr` reports distances), so the answer, ties to the
lowest index included, is the k-d tree's (tested against it and brute force, with Hypothesis).

No library offers this (an exact, tie-aware blocked search with a pruning bound that is itself a
matrix product): scipy and sklearn have trees only, and faiss's exact search is brute force in
float32. When the bounds prune too little (data spanned by few directions, whose rows crowd into
a few cells) `nearest_by_cells` says so and the caller uses its k-d tree.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numpy.typing import NDArray
from scipy.spatial import cKDTree
from threadpoolctl import ThreadpoolController

FloatArray = NDArray[np.float64]
Float32Array = NDArray[np.float32]
Int32Array = NDArray[np.int32]
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
_QUERY_CHUNK = 2048
_SAMPLE = 2_000
# One BLAS thread for the products: each is small (a cell's rows by its queries) and a
# multi-threaded BLAS spends more on waking and syncing threads than on the product (some 4x
# more CPU at d = 10); see also safeaccess.rules.qss.admit.
_BLAS = ThreadpoolController()
_EPS32 = float(np.finfo(np.float32).eps) / 2.0  # unit roundoff
_TINY32 = float(np.finfo(np.float32).tiny) * 64.0
# candidate rows per query for the exact re-check, on average, above which the tree answers
_MAX_CANDIDATES = 64


def nearest_by_cells(
    s: FloatArray,
    uniq: FloatArray,
    first: IntArray,
    tree: cKDTree,
    workers: int,
    max_share: float | None = None,
    exclude: IntArray | None = None,
) -> IntArray | None:
    """For each row of `s`, `first[j]` of its nearest row j of `uniq` (distinct rows; `first`
    their lowest indices in the caller's data, so ties between equally close rows resolve to
    the lowest index), or None when the cells would measure more than `max_share` (by default
    MAX_SHARE) of the rows of `uniq` per query on average (the caller's k-d tree is then
    faster). `tree` is a k-d tree over `uniq`; `workers` its query threads, as scipy counts
    them. `exclude[i]`, if given, is the row of `uniq` query i may not take (itself, for the
    leave-one-out distance; `uniq` then needs two rows or more)."""
    # (the limit is process-wide: other threads' products run single-threaded meanwhile, which
    # changes their speed, never their result)
    with _BLAS.limit(limits=1, user_api="blas"):
        share = MAX_SHARE if max_share is None else max_share
        return _nearest(s, uniq, first, tree, workers, share, exclude)


def _nearest(
    s: FloatArray,
    uniq: FloatArray,
    first: IntArray,
    tree: cKDTree,
    workers: int,
    max_share: float,
    exclude: IntArray | None,
) -> IntArray | None:
    n, d = s.shape
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if n >= 2**31:
        return None  # queries are numbered in int32
    cut, code = _cell_codes(uniq)
    order = np.argsort(code, kind="stable")
    cells, starts, counts = np.unique(code[order], return_index=True, return_counts=True)
    if _own_cell_share(counts) > max_share:
        return None
    high = ((cells[:, None] >> np.arange(d)) & 1).astype(np.float64)  # cell x column
    # Products and bounds are in float32 (half the time of float64; their rounding is bounded
    # and every row near the smallest is measured again exactly). Coordinates are centred on
    # the real rows and scaled by a power of two (exact) to magnitude at most 1, so nothing
    # overflows; beyond float64's comfortable range the tree answers.
    centre = (uniq.min(axis=0) + uniq.max(axis=0)) / 2.0
    extent = max(float(np.abs(s - centre).max()), float(np.abs(uniq - centre).max()))
    if extent > 2.0**400 or 0.0 < extent < 2.0**-400:
        return None
    scale = 2.0 ** -math.ceil(math.log2(extent)) if extent > 0.0 else 1.0
    limit = max_share * uniq.shape[0]
    if n > 4 * _SAMPLE:
        # a spread sample tells cheaply whether the cells prune enough (data spanned by few
        # directions crowd into few cells); only the speed depends on this estimate
        rows_picked = np.linspace(0, n - 1, _SAMPLE).astype(np.int64)
        pick = s[rows_picked]
        own = None if exclude is None else exclude[rows_picked]
        approx, u2 = _approximate(pick, uniq, tree, workers, own)
        visits = _visits(pick, cut, high, u2, scale * scale, workers)
        if _measured(visits, counts) > limit * _SAMPLE:
            return None

    # Queries in the leaf order of a k-d tree over themselves: neighbouring queries visit the
    # same tree nodes and the same cells, so both stay in cache.
    walk = cKDTree(s).indices if n > 1 else np.zeros(n, dtype=np.int64)
    sq = s[walk]
    own = None if exclude is None else exclude[walk]
    approx, u2 = _approximate(sq, uniq, tree, workers, own)
    visits = _visits(sq, cut, high, u2, scale * scale, workers)
    if _measured(visits, counts) > limit * n:
        return None

    # [-2 q, 1] . [p, |p|^2] is |q - p|^2 - |q|^2, enough to rank the rows for q
    rows = uniq[order]
    sc, rc = (sq - centre) * scale, (rows - centre) * scale
    q_aug = np.ascontiguousarray(np.c_[-2.0 * sc, np.ones(n)].T, dtype=np.float32)
    r_aug = np.ascontiguousarray(np.c_[rc, np.einsum("ij,ij->i", rc, rc)], dtype=np.float32)
    q_norm2 = np.einsum("ij,ij->i", sc, sc)
    # |computed - exact| of one entry: d + 1 rounded inputs and products, d + 1 additions, of
    # terms whose magnitudes sum to at most (|q| + max |p|)^2 (float32 unit roundoff 2^-24;
    # twice the textbook bound, and at least float32's smallest normal for underflow)
    p_max = math.sqrt(float(np.einsum("ij,ij->i", rc, rc).max()))
    err = 2.0 * (d + 5) * _EPS32 * (np.sqrt(q_norm2) + p_max) ** 2 + _TINY32

    # each excluded row's position among the cell-ordered rows
    own_pos = None if own is None else np.argsort(order)[own]

    def products(c: int, queries: Int32Array) -> Float32Array:
        block = _products(r_aug, starts[c], counts[c], q_aug, queries)
        if own_pos is not None:
            at = own_pos[queries] - starts[c]
            mine = (at >= 0) & (at < counts[c])
            block[at[mine], np.flatnonzero(mine)] = np.inf
        return block

    def smallest(part: range) -> tuple[FloatArray, list[Float32Array]]:
        # each thread its own running minimum: queries are shared between cells
        best = np.full(n, np.inf)
        lows = []
        for c in part:
            low = products(c, visits[c]).min(axis=0, initial=np.inf)
            best[visits[c]] = np.minimum(best[visits[c]], low)
            lows.append(low)
        return best, lows

    threads = _threads(workers)
    parts = [range(i, cells.shape[0], threads) for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:  # products and minima release the GIL
        results = list(pool.map(smallest, parts))
    best = np.minimum.reduce([b for b, _ in results])
    cell_min: list[Float32Array] = [np.empty(0, dtype=np.float32)] * cells.shape[0]
    for part, (_, lows) in zip(parts, results, strict=True):
        for c, low in zip(part, lows, strict=True):
            cell_min[c] = low

    # Every row whose exact value is within the tie tolerance of the smallest has a computed
    # value within 2 err (plus that tolerance) of the smallest computed one.
    ties = 4.0 * _TIE_RTOL * np.maximum(best + q_norm2, 0.0)
    cut_off = best + 2.0 * err + ties
    pair_q: list[IntArray] = [np.arange(n, dtype=np.int64)]
    pair_r: list[IntArray] = [approx]  # the approximate neighbour is always a candidate
    pairs = n
    for c, queries in enumerate(visits):
        again = queries[cell_min[c] <= cut_off[queries]]
        if again.size == 0:
            continue
        block = products(c, again)
        hit_r, hit_q = np.nonzero(block <= cut_off[again])
        pairs += hit_q.size
        if pairs > _MAX_CANDIDATES * n:
            # rows the products cannot tell apart (many equally near rows, or queries far
            # from rows close together): the tree resolves them with less memory
            return None
        pair_q.append(again[hit_q])
        pair_r.append(order[starts[c] + hit_r])
    qs, rs = np.concatenate(pair_q), np.concatenate(pair_r)
    if own is not None:
        keep = rs != own[qs]
        qs, rs = qs[keep], rs[keep]
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


def crowded(rows: FloatArray, max_share: float | None = None) -> bool:
    """Whether the cells of `rows` are so uneven that a query distributed like them would
    measure more than `max_share` (by default MAX_SHARE) of them in its own cell alone: the
    cell search would then decline (a cheap test before building anything for it)."""
    _, code = _cell_codes(rows)
    counts = np.unique(code, return_counts=True)[1]
    return _own_cell_share(counts) > (MAX_SHARE if max_share is None else max_share)


def _cell_codes(rows: FloatArray) -> tuple[FloatArray, IntArray]:
    """Each column's median, and each row's cell: bit j set where the row is at or above the
    median of column j."""
    cut = np.median(rows, axis=0)
    code = (rows >= cut) @ (np.int64(1) << np.arange(rows.shape[1], dtype=np.int64))
    return cut, np.asarray(code, dtype=np.int64)


def _own_cell_share(counts: IntArray) -> float:
    # a query always measures its own cell's rows: with queries spread as the rows are, that
    # alone is sum(count^2) / rows^2 of them (data spanned by few directions: over 10 %)
    total = float(counts.sum())
    return float((counts.astype(np.float64) ** 2).sum()) / (total * total)


def _approximate(
    s: FloatArray, uniq: FloatArray, tree: cKDTree, workers: int, own: IntArray | None
) -> tuple[IntArray, FloatArray]:
    """An approximate neighbour of each query other than its `own` row (at most 1 + APPROX_EPS
    times farther than the nearest) and its squared distance, an upper bound on the nearest
    one's."""
    if own is None:
        _, idx = tree.query(s, k=1, eps=APPROX_EPS, workers=workers)
        approx = np.asarray(idx, dtype=np.int64).reshape(s.shape[0])
    else:
        _, idx2 = tree.query(s, k=2, eps=APPROX_EPS, workers=workers)
        pair = np.asarray(idx2, dtype=np.int64).reshape(s.shape[0], 2)
        approx = np.where(pair[:, 0] != own, pair[:, 0], pair[:, 1])
    diff = s - uniq[approx]
    return approx, np.einsum("ij,ij->i", diff, diff)


def _measured(visits: list[Int32Array], counts: IntArray) -> float:
    """Query-row distances the cells would compute."""
    return float(sum(v.size * int(k) for v, k in zip(visits, counts, strict=True)))


def _threads(workers: int) -> int:
    return max(1, os.cpu_count() or 1) if workers < 1 else workers


def _visits(
    s: FloatArray,
    cut: FloatArray,
    high: FloatArray,
    u2: FloatArray,
    scale2: float,
    workers: int,
) -> list[Int32Array]:
    """For each cell, the queries (ascending, as int32 to halve the memory of some 4 % of all
    query-cell pairs) whose approximate neighbour (at squared distance
    `u2`) is not nearer than the cell's lower bound.

    The squared distance from query q to a row of cell c is at least the sum, over the columns
    where c lies on the other side of the median, of (q_j - cut_j)^2: a product of the cells'
    side bits with per-query weights. The sides and weights are taken in the caller's
    coordinates (a side must match the cells' own test), the weights times `scale2` (a power of
    two, exact) so the float32 product cannot overflow. A query visits a cell unless the
    computed bound exceeds its limit by more than the product's rounding can account for
    (4 (d + 2) float32 unit roundoffs of the weights' sum and the limit, plus underflow; the
    limit itself is the scaled u2 with a relative 1e-9). Queries go in chunks, so the
    cells x queries bounds stay small."""
    n, d = s.shape
    high32 = high.astype(np.float32)

    def chunk(start: int) -> tuple[Int32Array, Int32Array]:
        q = s[start : start + _QUERY_CHUNK]
        side = q >= cut
        w = (q - cut) ** 2 * scale2
        weights = np.ascontiguousarray(np.where(side, -w, w).T, dtype=np.float32)
        limit = u2[start : start + q.shape[0]] * scale2 * (1.0 + 1e-9)
        slack = 4.0 * (d + 2) * (_EPS32 * (w.sum(axis=1) + limit) + _TINY32)
        rhs = limit - np.where(side, w, 0.0).sum(axis=1) + slack
        bound = high32 @ weights
        # (flat indices and a division: 2-D nonzero takes 3x longer)
        flat = np.flatnonzero(bound <= rhs.astype(np.float32)[None, :])
        cell, query = np.divmod(flat, q.shape[0])
        return cell.astype(np.int32), (query + start).astype(np.int32)

    with ThreadPoolExecutor(_threads(workers)) as pool:
        found = list(pool.map(chunk, range(0, n, _QUERY_CHUNK)))
    cell_all = np.concatenate([c for c, _ in found])
    query_all = np.concatenate([q for _, q in found])
    del found
    # each chunk's pairs come sorted by cell: a stable sort merges the runs, queries ascending
    small = cell_all.astype(np.int16) if high.shape[0] <= np.iinfo(np.int16).max else cell_all
    by_cell = np.argsort(small, kind="stable")  # a radix sort for 16-bit keys
    edges = np.r_[0, np.cumsum(np.bincount(cell_all, minlength=high.shape[0]))]
    query_sorted = query_all[by_cell]
    return [query_sorted[edges[c] : edges[c + 1]] for c in range(high.shape[0])]


def _products(
    r_aug: Float32Array, start: int, count: int, q_aug: Float32Array, queries: Int32Array
) -> Float32Array:
    """|q - p|^2 - |q|^2 (rounded) for the cell's rows p (rows of the result) and `queries`
    (columns): rows x queries, so the minimum over rows is an element-wise one."""
    return np.asarray(r_aug[start : start + count] @ q_aug[:, queries], dtype=np.float32)
