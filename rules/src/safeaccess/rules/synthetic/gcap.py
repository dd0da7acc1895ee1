"""Hittmeir's generalised correct attribution probability (GCAP, Alg. 3.1), exactly, ties kept.

For a real record j with key K_j, the attacker's neighbour set is every synthetic record at the
smallest Hamming distance rho_j from K_j over the key columns; the prediction is the majority
target in that set (ties to the lowest level).

Search by shells instead of 10^10 record pairs: for r = 0, 1, ..., k and each set M of r key
positions, group the unique synthetic keys by the key with the fields of M cleared and sum their
target counts; a real key joins the group with its own masked key. A synthetic key at distance
exactly r from a real key differs from it on one r-set D and joins only for M = D, so it is
counted once; after all sets of a shell, every real key with a non-zero total has rho = r. At most
2^k sort-joins of unique packed keys, with an early exit once every real key is resolved.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations
from math import comb

import numpy as np
from numpy.typing import ArrayLike

from safeaccess.rules.synthetic.coding import (
    IntArray,
    coded_matrix,
    coded_vector,
    fits_packed,
    levels_checked,
    pack,
    row_ids,
)
from safeaccess.rules.synthetic.errors import SyntheticCheckError

# project(M, todo) -> (synthetic group keys, real keys of the unresolved real keys `todo`),
# both with the key positions in M ignored.
_Projector = Callable[[tuple[int, ...], IntArray], tuple[IntArray, IntArray]]


def gcap(
    real_keys: ArrayLike,
    real_target: ArrayLike,
    syn_keys: ArrayLike,
    syn_target: ArrayLike,
    key_levels: Sequence[int],
    target_levels: int,
) -> tuple[IntArray, IntArray]:
    """Target counts of each real record's GCAP neighbour set N_j in S, and its distance rho_j.

    Inputs are level-coded: `real_keys` (n_real x k) and `syn_keys` (n_syn x k) with column i in
    0..key_levels[i]-1, targets in 0..target_levels-1. Returns `counts` int64[n_real,
    target_levels] (counts[j, t] = |{s in N_j : T_s = t}|) and `rho` int64[n_real].
    `real_target` is validated for shape only; the attacker never sees it.
    """
    levels = levels_checked(key_levels)
    t_levels = _target_levels(target_levels)
    rk = coded_matrix(real_keys, levels, "real_keys")
    rt = coded_vector(real_target, t_levels, "real_target")
    sk = coded_matrix(syn_keys, levels, "syn_keys")
    st = coded_vector(syn_target, t_levels, "syn_target")
    _same_length(rk, rt, "real_keys", "real_target")
    _same_length(sk, st, "syn_keys", "syn_target")
    if sk.shape[0] == 0:
        raise SyntheticCheckError("the synthetic data has no records: GCAP needs at least one")
    real_ids, real_u = _unique_rows(rk, levels)
    syn_ids, syn_u = _unique_rows(sk, levels)
    syn_counts = _class_counts(syn_ids, st, syn_u.shape[0], t_levels)
    project = _projector(real_u, syn_u, levels)
    todo = np.arange(real_u.shape[0], dtype=np.int64)
    counts_u, rho_u = _shells(project, syn_counts, todo, len(levels), 0, None, real_u.shape[0])
    return counts_u[real_ids], rho_u[real_ids]


def gcap_loo(
    keys: ArrayLike,
    target: ArrayLike,
    key_levels: Sequence[int],
    target_levels: int,
) -> tuple[IntArray, IntArray]:
    """GCAP of each record against all the other records (S = O without the victim).

    The leave-one-out reference: what Alg. 3.1 infers about record j from everyone else. Same
    return shapes as `gcap`. Needs at least two records.
    """
    levels = levels_checked(key_levels)
    t_levels = _target_levels(target_levels)
    k_arr = coded_matrix(keys, levels, "keys")
    t_arr = coded_vector(target, t_levels, "target")
    _same_length(k_arr, t_arr, "keys", "target")
    n = k_arr.shape[0]
    if n < 2:
        raise SyntheticCheckError(f"the leave-one-out reference needs at least 2 records, got {n}")
    ids, uniq = _unique_rows(k_arr, levels)
    n_u = uniq.shape[0]
    class_counts = _class_counts(ids, t_arr, n_u, t_levels)
    totals = class_counts.sum(axis=1)
    counts_u = class_counts.copy()
    rho_u = np.zeros(n_u, dtype=np.int64)
    # A key held by >= 2 records keeps the others at distance 0 once the victim leaves; a key held
    # by one record is the victim alone, so its record is searched in the shells r >= 1, where it
    # joins every one of the C(k, r) groups of its own key and is subtracted that many times.
    single = np.flatnonzero(totals == 1)
    if single.size:
        project = _projector(uniq, uniq, levels)
        c_single, r_single = _shells(
            project, class_counts, single, len(levels), 1, class_counts, n_u
        )
        counts_u[single] = c_single[single]
        rho_u[single] = r_single[single]
    counts = counts_u[ids]
    rho = rho_u[ids]
    at_zero = np.flatnonzero(rho == 0)
    counts[at_zero, t_arr[at_zero]] -= 1  # the victim's own record leaves its key class
    return counts, rho


def predict(counts: ArrayLike) -> IntArray:
    """Majority vote of each neighbour set: the level with the largest count, ties to the lowest."""
    arr = np.asarray(counts)
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise SyntheticCheckError(f"counts must be a 2-D array (records x levels), got {arr.shape}")
    return np.argmax(arr, axis=1).astype(np.int64)


def _shells(
    project: _Projector,
    syn_counts: IntArray,
    todo: IntArray,
    k: int,
    start: int,
    self_counts: IntArray | None,
    n_real: int,
) -> tuple[IntArray, IntArray]:
    t_levels = syn_counts.shape[1]
    counts = np.zeros((n_real, t_levels), dtype=np.int64)
    rho = np.full(n_real, -1, dtype=np.int64)
    for r in range(start, k + 1):
        if todo.size == 0:
            break
        acc = np.zeros((todo.size, t_levels), dtype=np.int64)
        for cleared in combinations(range(k), r):
            syn_key, real_key = project(cleared, todo)
            order = np.argsort(syn_key, kind="stable")
            sorted_key = syn_key[order]
            starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
            group_key = sorted_key[starts]
            group_sum = np.add.reduceat(syn_counts[order], starts, axis=0)
            pos = np.minimum(np.searchsorted(group_key, real_key), group_key.size - 1)
            hit = group_key[pos] == real_key
            acc[hit] += group_sum[pos[hit]]
        if self_counts is not None:
            acc -= comb(k, r) * self_counts[todo]
        done = acc.sum(axis=1) > 0
        counts[todo[done]] = acc[done]
        rho[todo[done]] = r
        todo = todo[~done]
    if todo.size:  # pragma: no cover - the shell r = k joins every key with every other
        raise SyntheticCheckError("GCAP search left records unresolved")
    return counts, rho


def _projector(real_u: IntArray, syn_u: IntArray, levels: Sequence[int]) -> _Projector:
    """Masked keys by bit operations when the key tuple packs into an int64, else by re-coding
    the kept columns (rows of the kept columns mapped to common ids)."""
    if real_u.ndim == 1:
        _, masks = pack(np.zeros((0, len(levels)), dtype=np.int64), levels)
        full = 0
        for m in masks:
            full |= m

        def by_bits(cleared: tuple[int, ...], todo: IntArray) -> tuple[IntArray, IntArray]:
            keep = full
            for i in cleared:
                keep &= ~masks[i]
            return syn_u & keep, real_u[todo] & keep

        return by_bits

    def by_rows(cleared: tuple[int, ...], todo: IntArray) -> tuple[IntArray, IntArray]:
        kept = [i for i in range(len(levels)) if i not in cleared]
        if not kept:
            return np.zeros(syn_u.shape[0], np.int64), np.zeros(todo.size, np.int64)
        s_ids, r_ids = row_ids(syn_u[:, kept], real_u[todo][:, kept])
        return s_ids, r_ids

    return by_rows


def _unique_rows(keys: IntArray, levels: Sequence[int]) -> tuple[IntArray, IntArray]:
    """(id of each record's key, the unique keys): packed int64s when they fit, else rows."""
    if fits_packed(levels):
        packed, _ = pack(keys, levels)
        uniq, inv = np.unique(packed, return_inverse=True)
        return inv.reshape(-1).astype(np.int64), uniq
    uniq_rows, inv = np.unique(keys, axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int64), uniq_rows


def _class_counts(ids: IntArray, target: IntArray, n_groups: int, t_levels: int) -> IntArray:
    flat = np.bincount(ids * t_levels + target, minlength=n_groups * t_levels)
    return flat.reshape(n_groups, t_levels).astype(np.int64)


def _target_levels(target_levels: int) -> int:
    return levels_checked([target_levels])[0]


def _same_length(keys: IntArray, target: IntArray, kname: str, tname: str) -> None:
    if keys.shape[0] != target.shape[0]:
        raise SyntheticCheckError(
            f"{kname} has {keys.shape[0]} records but {tname} has {target.shape[0]}"
        )
