"""The rank certificate kept across admissions: k disjoint completing sets, each with an inverse.

The certificate of `certificate.py` (a support S with fewer than k records avoids every atom of
k or more records and must meet the small part of every completing set) holds for any family of
sets C₁ … C_t of atoms such that

- each A[:, Cᵢ] has rank R (all admitted rows), and
- the atoms of Cᵢ with fewer than k records (its *small part*) are pairwise disjoint across sets.

S then meets t disjoint small parts, so it holds at least t records; with t = k sets the bound is
reached whatever the atoms' sizes. Atoms of k or more records may be shared by every set.

What is kept, per set: `cols` (R atom ids with A[:, cols] square and invertible mod a small
prime p) and `inv` = A[:, cols]⁻¹ mod p. Rank R mod p implies rank R over the rationals, so a
kept set is a certificate in any prime; p < 2**21 makes every product one exact float product.

Across an admission:

- *Splits* keep ids: an atom keeps its id for one of its pieces, and every piece has its
  parent's column on the old rows. So A[:, cols] is unchanged on the old rows, whatever splits.
- *Shared atoms that became small* (a big atom split into small pieces) would break
  disjointness: every set but one swaps it for one of its pieces, which has the same old column,
  so `inv` does not change (a big piece can stand in for every set). Where the pieces run out,
  the positions left (holes) are filled together by other candidates, with one block (Woodbury)
  update of `inv` (`_fill_holes`).
- *New rows* (Δ of them): with U = B[:, cols] (the new rows on the set's columns), H = U·inv and
  a candidate atom x with old part a and new part b, the residual r(x) = b − H·a is the part of x
  the old columns cannot reach. Δ candidates with independent residuals (matrix S) complete the
  set, and the bordered inverse follows from the Schur complement: with G = inv·A_old[:, X],
  inv' = [[inv + G S⁻¹ H, −G S⁻¹], [−S⁻¹ H, S⁻¹]]. Cost O(R²·Δ) per set, no work over atoms
  beyond reading the candidates' columns.

Whenever a step cannot be taken (no candidate to fill a hole, too few candidates with
independent residuals in the bounded pool), the caller rebuilds the kept sets from scratch
(`build`), and decides exactly (`certificate.decide`) only when those do not certify.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from safeaccess.rules.qss import modp

Int64Array = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]
FloatArray = npt.NDArray[np.float64]

#: Candidate batches read per extension before giving up (the caller then decides from scratch).
_MAX_BATCHES = 6
#: Rows added at a time when a kept certificate is rebuilt from scratch.
_BUILD_CHUNK = 64


@dataclass(frozen=True)
class KeptSets:
    """Completing sets over the first `n_rows` admitted rows, each with its exact inverse."""

    p: int
    n_rows: int
    cols: tuple[Int64Array, ...]  # per set: (n_rows,) atom ids, position j ↔ inverse row j
    inv: tuple[Int64Array, ...]  # per set: (n_rows, n_rows), A[:, cols]⁻¹ mod p

    @classmethod
    def empty(cls, n_sets: int, p: int | None = None) -> KeptSets:
        """Sets over no rows (the empty matrix is its own inverse)."""
        prime = p if p is not None else modp.random_prime(1 << 20, modp.SMALL_PRIME_LIMIT)
        return cls(
            p=prime,
            n_rows=0,
            cols=tuple(np.empty(0, np.int64) for _ in range(n_sets)),
            inv=tuple(np.zeros((0, 0), np.int64) for _ in range(n_sets)),
        )

    @property
    def n_sets(self) -> int:
        return len(self.cols)

    def small_members(self, sizes: Int64Array, k: int) -> int:
        """How many atoms below k the sets hold in all (the certificate's size)."""
        return int(sum(int((sizes[c] < k).sum()) for c in self.cols))

    def certifies(self, sizes: Int64Array, k: int) -> bool:
        """Whether the sets prove that no combination over fewer than k records is determined:
        at least k sets (or one without a small atom) and small parts pairwise disjoint."""
        small = [c[sizes[c] < k] for c in self.cols]
        if any(s.size == 0 for s in small):
            return True  # the big atoms with that set span everything: nothing small is determined
        if self.n_sets < k:
            return False
        joined = np.concatenate(small)
        return int(np.unique(joined).size) == int(joined.size)


def columns(
    indptr: Int64Array,
    indices: Int32Array,
    n_atoms: int,
    atoms: Int64Array,
    n_rows: int,
    values: Int64Array | None = None,
) -> FloatArray:
    """Dense columns (first `n_rows` rows) of the CSR rows for these atoms: one pass over the
    rows' entries. 0/1, or with weighted rows each entry's weight mod the sets' prime
    (`values`, below 2**21: exact as floats)."""
    out = np.zeros((n_rows, int(atoms.shape[0])), np.float64)
    if atoms.size == 0 or n_rows == 0:
        return out
    lut = np.full(n_atoms, -1, np.int32)
    lut[atoms] = np.arange(atoms.shape[0], dtype=np.int32)
    hit = lut[indices[: int(indptr[n_rows])]]
    where = np.flatnonzero(hit >= 0)
    rows = np.searchsorted(indptr, where, side="right") - 1
    out[rows, hit[where]] = 1.0 if values is None else values[where].astype(np.float64)
    return out


def _times(a: Int64Array, b: FloatArray, p: int) -> Int64Array:
    """(a @ b) mod p for columns `b` read by `columns`: the one exact float product of
    `modp.matmul_01` when they are 0/1, the general product when rows are weighted."""
    if b.size == 0 or float(b.max()) <= 1.0:
        return modp.matmul_01(a, b, p)
    return modp.matmul(a, b.astype(np.int64), p)


def _new_rows_on(
    indptr: Int64Array,
    indices: Int32Array,
    lut: Int32Array,
    cols: Int64Array,
    r0: int,
    r1: int,
    values: Int64Array | None = None,
) -> FloatArray:
    """U = B[:, cols]: the rows r0..r1-1 on the set's columns (0/1, or the entries' weights mod
    the sets' prime, `values`). `lut` is all -1 on entry and on exit."""
    lut[cols] = np.arange(cols.shape[0], dtype=np.int32)
    start, stop = int(indptr[r0]), int(indptr[r1])
    pos = lut[indices[start:stop]]
    lut[cols] = -1
    where = np.flatnonzero(pos >= 0)
    rows = np.searchsorted(indptr, start + where, side="right") - 1 - r0
    u = np.zeros((r1 - r0, int(cols.shape[0])), np.float64)
    u[rows, pos[where]] = 1.0 if values is None else values[start + where].astype(np.float64)
    return u


Holes = list[list[int]]


def substitute(
    kept: KeptSets, ancestor: Int64Array, n_old: int, sizes: Int64Array, k: int
) -> tuple[KeptSets, Holes]:
    """After splits: every set but one swaps a shared atom that became small for a piece of it
    (same column on the old rows, so the inverses stand). Where pieces run out, the position is
    returned as a hole, per set, for `extend` to fill.

    `ancestor[a]` is the atom each atom split from in this admission (itself for ids < n_old)."""
    holes: Holes = [[] for _ in kept.cols]
    joined = np.concatenate(kept.cols) if kept.cols else np.empty(0, np.int64)
    small = joined[sizes[joined] < k]
    atoms, counts = np.unique(small, return_counts=True)
    shared = atoms[counts > 1]
    if shared.size == 0:
        return kept, holes
    fresh = np.arange(n_old, int(ancestor.shape[0]), dtype=np.int64)
    by_parent = np.argsort(ancestor[fresh], kind="stable")
    parents = ancestor[fresh][by_parent]
    cols = [c.copy() for c in kept.cols]
    for atom in (int(a) for a in shared):
        lo, hi = np.searchsorted(parents, [atom, atom + 1])
        pieces = fresh[by_parent[lo:hi]]
        big = pieces[sizes[pieces] >= k]
        spare = list(pieces[sizes[pieces] < k])
        first = True
        for i, c in enumerate(cols):
            where = np.flatnonzero(c == atom)
            if where.size == 0:
                continue
            if first:
                first = False  # one set keeps the atom itself
                continue
            if big.size:
                c[where[0]] = big[0]  # a big piece may be shared by every set
            elif spare:
                c[where[0]] = spare.pop()
            else:
                holes[i].append(int(where[0]))
    return KeptSets(p=kept.p, n_rows=kept.n_rows, cols=tuple(cols), inv=kept.inv), holes


Supply = Callable[[], Iterator[tuple[Int64Array, FloatArray]]]


def _fill_holes(
    cols: Int64Array,
    inv: Int64Array,
    holes: list[int],
    atoms: Int64Array,
    old: FloatArray,
    free: npt.NDArray[np.bool_],
    p: int,
) -> tuple[Int64Array, list[int]]:
    """Replace the columns at the hole positions by candidates (old parts `old`, usable where
    `free`). Returns the new inverse and the candidate positions used; `cols` and `holes` are
    updated in place (holes no candidate can fill stay).

    Candidates X may replace positions J together iff W[J, :] is invertible, W = inv·X; then
    (Woodbury, A' = A + (X − A E_J) E_Jᵀ) inv' = inv − (W − E_J)·W[J, :]⁻¹·inv[J, :]. A window
    of candidates a little wider than the holes is read at a time: its columns independent on
    the hole rows (inv[J, :]·X, by elimination), then as many hole rows on which they are
    independent, are replaced in one block update instead of one rank-one update per hole."""
    used: list[int] = []
    start = 0
    width = 2 * len(holes) + 8
    while holes:
        # a window's candidates not taken may fill the holes left once the inverse changed:
        # the window moves on only when it fills none
        avail = np.flatnonzero(free)
        if start >= avail.shape[0]:
            break
        window = avail[start : start + width]
        hole_rows = np.asarray(holes, dtype=np.int64)
        reach = _times(inv[hole_rows, :], old[:, window], p)  # (holes, window)
        pivot_cols = np.asarray(modp.pivot_columns(reach, p), dtype=np.int64)
        if pivot_cols.size == 0:
            start += width
            width *= 2
            continue
        sub = reach[:, pivot_cols]  # rank = its column count
        pivot_rows = np.asarray(modp.pivot_columns(sub.T.copy(), p), dtype=np.int64)
        rows_j = hole_rows[pivot_rows]
        picks = window[pivot_cols]
        core_inv = modp.invert(sub[pivot_rows, :], p)
        if core_inv is None:  # the eliminations said independent: an arithmetic fault
            break
        w = _times(inv, old[:, picks], p)  # (R, ρ)
        w[rows_j, np.arange(rows_j.shape[0])] -= 1
        w %= p
        inv = (inv - modp.matmul(modp.matmul(w, core_inv, p), inv[rows_j, :], p)) % p
        cols[rows_j] = atoms[picks]
        free[picks] = False
        used.extend(int(x) for x in picks)
        for j in rows_j:
            holes.remove(int(j))
        width = 2 * len(holes) + 8
    return inv, used


def extend(
    kept: KeptSets,
    indptr: Int64Array,
    indices: Int32Array,
    n_rows: int,
    sizes: Int64Array,
    k: int,
    supply: Supply,
    holes: Holes | None = None,
    values: Int64Array | None = None,
) -> KeptSets | None:
    """The sets with their holes filled and completed to the rows kept.n_rows..n_rows-1, or
    None when the candidates that `supply` yields (atom ids and their dense columns over the
    first n_rows rows) run out first.

    Candidates are taken first fit: each goes to the first set it serves; an atom below k joins
    at most one set, a big atom may join every set."""
    p = kept.p
    r0, r1 = kept.n_rows, n_rows
    delta = r1 - r0
    gaps = [list(h) for h in holes] if holes else [[] for _ in kept.cols]
    if delta == 0 and not any(gaps):
        return kept
    n_atoms = int(sizes.shape[0])
    cols = [c.copy() for c in kept.cols]
    invs = list(kept.inv)
    lut = np.full(n_atoms, -1, np.int32)
    h_mats: list[Int64Array | None] = [None] * len(cols)
    claimed = np.zeros(n_atoms, dtype=bool)
    for c in cols:
        claimed[c[sizes[c] < k]] = True
    bases = [modp.ColumnBasis(delta, p) for _ in cols]
    chosen_atoms: list[list[Int64Array]] = [[] for _ in cols]
    chosen_old: list[list[FloatArray]] = [[] for _ in cols]
    chosen_res: list[list[Int64Array]] = [[] for _ in cols]

    def done() -> bool:
        return all(b.rank == delta for b in bases) and not any(gaps)

    for atoms, block in supply():
        for i in range(len(cols)):
            if bases[i].rank == delta and not gaps[i]:
                continue
            free = ~claimed[atoms]
            if gaps[i]:
                invs[i], used = _fill_holes(cols[i], invs[i], gaps[i], atoms, block[:r0], free, p)
                for pick in used:
                    if sizes[atoms[pick]] < k:
                        claimed[atoms[pick]] = True
                if gaps[i]:
                    continue
            if bases[i].rank == delta:
                continue
            h = h_mats[i]
            if h is None:
                u = _new_rows_on(indptr, indices, lut, cols[i], r0, r1, values)
                # H = U·inv, as (invᵀ·Uᵀ)ᵀ: U is the 0/1 factor of the exact float product
                h = _times(invs[i].T, u.T, p).T.copy()
                h_mats[i] = h
            avail = np.flatnonzero(~claimed[atoms])
            # windows several times wider than the rank still missing, doubling: most
            # candidates are independent, so one or two windows usually complete the set, and
            # each window costs one product and one elimination whatever its width (the greedy
            # choice, in candidate order, is the same whatever the windows)
            start, width = 0, 4 * (delta - bases[i].rank) + 64
            while start < avail.size and bases[i].rank < delta:
                window = avail[start : start + width]
                start += width
                width *= 2
                x = block[:, window]
                residual = _residuals(x[r0:r1], x[:r0], h, p)
                added = bases[i].insert(residual)
                if not added:
                    continue
                picked = window[np.asarray(added, dtype=np.int64)]
                chosen_atoms[i].append(atoms[picked])
                chosen_old[i].append(block[:r0, picked])
                chosen_res[i].append(residual[:, added])
                claimed[atoms[picked][sizes[atoms[picked]] < k]] = True
        if done():
            break
    if not done():
        return None
    if delta == 0:
        return KeptSets(p=p, n_rows=r1, cols=tuple(cols), inv=tuple(invs))
    new_cols = []
    new_inv = []
    for i, (c, inv) in enumerate(zip(cols, invs, strict=True)):
        h = h_mats[i]
        assert h is not None  # every set reached rank delta through the residual step
        s = np.concatenate(chosen_res[i], axis=1)
        s_inv = modp.invert(s, p)
        if s_inv is None:  # the residual basis said independent: an arithmetic fault
            return None
        q = np.concatenate(chosen_old[i], axis=1)
        g = _times(inv, q, p)  # (r0, Δ)
        gs = modp.matmul(g, s_inv, p)
        full = np.empty((r1, r1), np.int64)
        full[:r0, :r0] = (inv + modp.matmul(gs, h, p)) % p
        full[:r0, r0:] = (-gs) % p
        full[r0:, :r0] = (-modp.matmul(s_inv, h, p)) % p
        full[r0:, r0:] = s_inv
        new_cols.append(np.concatenate([c, *chosen_atoms[i]]).astype(np.int64))
        new_inv.append(full)
    return KeptSets(p=p, n_rows=r1, cols=tuple(new_cols), inv=tuple(new_inv))


def _residuals(new: FloatArray, old: FloatArray, h: Int64Array, p: int) -> Int64Array:
    """b − H·a mod p for the candidates' new parts b and old parts a (0/1 columns)."""
    b: Int64Array = new.astype(np.int64)
    if old.shape[0] == 0:
        return b % p
    reach: Int64Array = _times(h, old, p)
    return (b - reach) % p


def candidate_order(
    indptr: Int64Array,
    indices: Int32Array,
    sizes: Int64Array,
    k: int,
    r0: int,
    r1: int,
    first: Int64Array | None = None,
    per_row: int = 24,
) -> Int64Array:
    """Atoms in the order candidates are tried: big atoms (shared by every set, they keep the
    small parts small); `first` (this admission's new pieces); then, for each row r0..r1-1, up
    to `per_row` of its atoms at random, so a rare cell still offers an atom to every set; then
    the rest at random (atoms split from one parent are nearly parallel: random is generic)."""
    rng = np.random.default_rng(secrets.randbits(64))
    n_atoms = int(sizes.shape[0])
    big = np.flatnonzero(sizes >= k).astype(np.int64)
    parts = [big[rng.permutation(big.shape[0])]]
    if first is not None and first.size:
        lead = first[sizes[first] < k]
        parts.append(lead[rng.permutation(lead.shape[0])])
    start, stop = int(indptr[r0]), int(indptr[r1])
    tiers: list[int] = []
    if stop > start:
        entries = indices[start:stop].astype(np.int64)
        lengths = np.diff(indptr[r0 : r1 + 1])
        rows = np.repeat(np.arange(r1 - r0, dtype=np.int32), lengths)
        # each row's entries in random order: shuffle, then a stable sort by row (the rows
        # stay contiguous, in CSR order, so an entry's rank in its row is its offset there)
        perm = rng.permutation(entries.shape[0])
        shuffled = perm[np.argsort(rows[perm], kind="stable")]
        rank = np.arange(entries.shape[0]) - np.repeat(indptr[r0:r1] - indptr[r0], lengths)
        for lo, hi in ((0, per_row), (per_row, 4 * per_row)):
            tier = entries[shuffled[(rank >= lo) & (rank < hi)]]
            tiers.append(len(parts))
            parts.append(tier[sizes[tier] < k])
    small = np.flatnonzero(sizes < k).astype(np.int64)
    parts.append(small[rng.permutation(small.shape[0])])
    # keep each atom's first place only (an atom may be in several new rows' tiers; the other
    # parts hold each atom once)
    seen = np.zeros(n_atoms, dtype=bool)
    kept_parts = []
    for i, part in enumerate(parts):
        part = part[~seen[part]]
        if i in tiers:
            _, first_place = np.unique(part, return_index=True)
            part = part[np.sort(first_place)]
        seen[part] = True
        kept_parts.append(part)
    return np.concatenate(kept_parts)


def batches(
    indptr: Int64Array,
    indices: Int32Array,
    n_atoms: int,
    n_rows: int,
    order: Int64Array,
    size: int,
    limit: int = _MAX_BATCHES,
    values: Int64Array | None = None,
) -> Supply:
    """Candidates in `order`, `size` at a time, with their columns read from the CSR rows; at
    most `limit` batches, each batch twice the size of the one before."""

    def gen() -> Iterator[tuple[Int64Array, FloatArray]]:
        start, step = 0, size
        for _ in range(limit):
            if start >= order.shape[0]:
                return
            atoms = order[start : start + step]
            start += step
            step *= 2
            yield atoms, columns(indptr, indices, n_atoms, atoms, n_rows, values)

    return gen


def build(
    indptr: Int64Array,
    indices: Int32Array,
    sizes: Int64Array,
    k: int,
    n_sets: int,
    data: FloatArray | None = None,
) -> KeptSets | None:
    """Kept sets over every row, from scratch: the rows are taken in chunks, each chunk an
    extension of the sets over the rows before it. None when the candidates run out. `data`:
    the entries' weights when some row is weighted."""
    n_rows = int(indptr.shape[0]) - 1
    n_atoms = int(sizes.shape[0])
    empty = KeptSets.empty(n_sets)
    kept: KeptSets | None = empty
    values = None if data is None else modp.float_mod(data, empty.p)
    r0 = 0
    while kept is not None and r0 < n_rows:
        r1 = min(n_rows, r0 + _BUILD_CHUNK)
        order = candidate_order(indptr, indices, sizes, k, r0, r1)
        need = (r1 - r0) * n_sets
        supply = batches(indptr, indices, n_atoms, r1, order, size=2 * need + 64, values=values)
        kept = extend(kept, indptr, indices, r1, sizes, k, supply, values=values)
        r0 = r1
    return kept
