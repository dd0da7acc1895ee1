"""Refining the atom partition of record ids by one query-set array, touching only its records.

An atom is a maximal set of record ids with the same membership in every admitted query set.
Refining by a new array (one cell index per record, -1 outside) splits each atom into the records
of each cell it meets plus the remainder outside the array. Atom ids stay stable: an atom keeps
its id for its untouched remainder (or, when every record of it is inside, for its first piece),
and the other pieces get fresh ids appended at the end, so records outside the new array are
never rewritten and nothing of size n_records is sorted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Int32Array = npt.NDArray[np.int32]
Int64Array = npt.NDArray[np.int64]
#: A query-set array: one cell index per record id (-1 outside), int8, int16 or int32.
CellArray = npt.NDArray[np.signedinteger[Any]]

# Above this many (atom, cell) key slots, and above 4 slots per touched record, the pairs are
# found atom by atom (`_pairs_by_atom`) instead of by counting into a dense table: a table much
# larger than the records costs more to allocate and scan (200 000 records over 194 000 atoms by
# 40 cells: 64 ms dense, 16 ms sorting every record), while 10 M records over a few thousand
# atoms stay dense.
_DENSE_KEY_SLOTS = 1 << 20


def _dense(slots: int, touched: int) -> bool:
    """Whether (atom, cell) pairs are counted in a dense table of `slots` keys (else found atom
    by atom)."""
    return slots <= max(_DENSE_KEY_SLOTS, 4 * touched)


@dataclass(frozen=True)
class Refinement:
    """What one array did to the partition. The records `inside` it get atom ids `labels`
    (the caller applies them with `apply`, only once the output is admitted); `inside` is None
    when the array holds every record (no index of size n_records is made then).

    `sizes` covers the new atom ids; `parent` maps each fresh id (from `n_before` on) to the atom
    it split from; `cell` is the array's cell index for every atom after the split (-1 outside)."""

    sizes: Int64Array
    parent: Int64Array
    cell: Int32Array
    outside: int
    n_before: int
    n_cells: int
    inside: Int64Array | None
    labels: Int32Array

    def apply(self, atom_of: Int32Array) -> None:
        """Write the new atom ids into `atom_of` (the array this refinement was made from)."""
        if self.inside is None:
            atom_of[:] = self.labels
        else:
            atom_of[self.inside] = self.labels

    def applied(self, atom_of: Int32Array, *, owned: bool) -> tuple[Int32Array, bool]:
        """The atom array after this refinement, and whether the caller owns it (may write to
        it): when the array held every record, its labels themselves (no copy; a read-only
        state's own array when nothing split, which the caller does not own); else `atom_of`
        with the new ids written in, copied first unless the caller `owned` it."""
        if self.inside is None:
            return self.labels, bool(self.labels.flags.writeable)
        out = atom_of if owned else atom_of.copy()
        out[self.inside] = self.labels
        return out, True


def refine(atom_of: Int32Array, sizes: Int64Array, outside: int, cells: CellArray) -> Refinement:
    """Split the atoms of `atom_of` (left unchanged) by the query-set array `cells`."""
    m = int(sizes.shape[0])
    # an array over every record (a table of the whole population) needs no index of its
    # records: at 10 M records that index and the two gathers through it cost more than the rest
    everyone = cells.shape[0] > 0 and int(cells.min()) >= 0
    inside = None if everyone else np.flatnonzero(cells >= 0)
    if inside is not None and inside.size == 0:
        return Refinement(
            sizes=sizes,
            parent=np.empty(0, dtype=np.int64),
            cell=np.full(m, -1, dtype=np.int32),
            outside=outside,
            n_before=m,
            n_cells=0,
            inside=inside.astype(np.int64),
            labels=np.empty(0, dtype=np.int32),
        )
    inner = cells if inside is None else cells[inside]
    member_atom = atom_of if inside is None else atom_of[inside]
    n_cells = int(inner.max()) + 1
    slots = m * n_cells
    inverse: Int64Array | None = None
    if _dense(slots, int(inner.shape[0])):
        counts = _dense_counts(member_atom, inner, n_cells, slots)
        present = np.flatnonzero(counts).astype(np.int64)
        pair_count = counts[present].astype(np.int64)
    else:
        present, inverse, pair_count = _pairs_by_atom(member_atom, inner, m, n_cells)
    pair_atom = present // n_cells
    pair_cell = (present % n_cells).astype(np.int32)
    touched = np.bincount(pair_atom, weights=pair_count, minlength=m).astype(np.int64)
    remainder = sizes - touched
    # pairs are sorted by key, so each atom's pairs are contiguous and its first one comes first
    first = np.ones(pair_atom.shape[0], dtype=bool)
    first[1:] = pair_atom[1:] != pair_atom[:-1]
    keeps = first & (remainder[pair_atom] == 0)
    fresh = ~keeps
    n_fresh = int(fresh.sum())
    new_id = np.empty(pair_atom.shape[0], dtype=np.int64)
    new_id[keeps] = pair_atom[keeps]
    new_id[fresh] = np.arange(m, m + n_fresh, dtype=np.int64)
    if n_fresh == 0:
        # Every touched atom lies within one cell (a repeated query set, or one coarser than
        # the partition): no id changes, so the labels are the records' atoms as they are, and
        # the pass that looks each record's key up is not made (at 10 M records it was a third
        # of an admission). A copy when that is the caller's own array: labels get written to.
        # Whether anything splits depends on the records, so this is data-dependent time (a
        # server hides it with reply padding, like the rest of an admission's time). A state's
        # own array is read-only (`AuditState`), so it is handed on as it is: no 40 MB copy at
        # 10 M records, and `applied` tells the caller it does not own it.
        writable = bool(member_atom.flags.writeable)
        labels = member_atom.astype(np.int32, copy=inside is None and writable)
    elif inverse is None:
        lut = np.empty(slots, dtype=np.int32)
        lut[present] = new_id
        labels = _dense_labels(member_atom, inner, n_cells, lut)
    else:
        labels = new_id[inverse].astype(np.int32)
    new_sizes = np.concatenate([remainder, pair_count[fresh]])
    new_sizes[pair_atom[keeps]] = pair_count[keeps]
    cell = np.full(m + n_fresh, -1, dtype=np.int32)
    cell[new_id] = pair_cell
    if outside >= 0 and remainder[outside] == 0:
        outside = -1
    return Refinement(
        sizes=new_sizes,
        parent=pair_atom[fresh],
        cell=cell,
        outside=outside,
        n_before=m,
        n_cells=n_cells,
        inside=None if inside is None else inside.astype(np.int64, copy=False),
        labels=labels,
    )


#: Records per block of the dense path. The key atom · n_cells + cell is built block by block
#: in one reused intp buffer, which `np.bincount` and `np.take` read without converting it:
#: over the whole array at once, each would first copy 10 M int32 keys into a fresh 80 MB intp
#: array (measured at 10 M records: 81 ms for the counts and labels whole, 51 ms by blocks).
_BLOCK = 1 << 18


def _dense_keys(
    atom: Int32Array, cell: CellArray, n_cells: int, slots: int
) -> Iterator[tuple[int, npt.NDArray[np.intp]]]:
    """(start, key block) over the records, each block in the same reused buffer; one block
    when the key table is larger than a block (a table per block would cost more)."""
    n = int(atom.shape[0])
    block = _BLOCK if slots <= _BLOCK else max(n, 1)
    buffer = np.empty(min(n, block), dtype=np.intp)
    for start in range(0, n, block):
        stop = min(start + block, n)
        key = buffer[: stop - start]
        np.multiply(atom[start:stop], n_cells, out=key, casting="unsafe")
        key += cell[start:stop]
        yield start, key


def _dense_counts(atom: Int32Array, cell: CellArray, n_cells: int, slots: int) -> Int64Array:
    """The record count of every (atom, cell) key slot (`np.bincount` of the keys)."""
    counts = np.zeros(slots, dtype=np.int64)
    for _, key in _dense_keys(atom, cell, n_cells, slots):
        counts += np.bincount(key, minlength=slots)
    return counts


def _dense_labels(atom: Int32Array, cell: CellArray, n_cells: int, lut: Int32Array) -> Int32Array:
    """Each record's new atom id: `lut` at its key."""
    labels = np.empty(atom.shape[0], dtype=np.int32)
    for start, key in _dense_keys(atom, cell, n_cells, int(lut.shape[0])):
        np.take(lut, key, out=labels[start : start + key.shape[0]])
    return labels


def _pairs_by_atom(
    atom: Int32Array, cell: CellArray, m: int, n_cells: int
) -> tuple[Int64Array, Int64Array, Int64Array]:
    """The distinct (atom, cell) pairs of the touched records as sorted keys atom · n_cells +
    cell, each record's pair and each pair's record count: what `np.unique(key,
    return_inverse=True, return_counts=True)` gives, without sorting every touched record.

    Most touched atoms meet one cell only (on realistic data most atoms hold one record): their
    pair is found by one write per record, and only the records of atoms that meet several
    cells are sorted. Pairs are placed atom by atom, in key order, by each atom's pair count."""
    atom64 = atom.astype(np.int64)
    one_cell = np.empty(m, dtype=np.int32)
    one_cell[atom64] = cell  # one of each touched atom's cells (any one will do)
    mixed_record = cell != one_cell[atom64]
    mixed_atom = np.zeros(m, dtype=bool)
    mixed_atom[atom64[mixed_record]] = True
    in_mixed = mixed_atom[atom64]
    per_atom = np.bincount(atom64, minlength=m).astype(np.int64)  # records touched per atom
    pairs_of = (per_atom > 0).astype(np.int64)
    sub_key = np.empty(0, dtype=np.int64)
    sub_inverse = np.empty(0, dtype=np.int64)
    sub_count = np.empty(0, dtype=np.int64)
    if mixed_atom.any():
        key = atom64[in_mixed] * n_cells + cell[in_mixed]
        sub_key, sub_inverse, sub_count = (
            a.astype(np.int64) for a in np.unique(key, return_inverse=True, return_counts=True)
        )
        sub_atom = sub_key // n_cells
        pairs_of[mixed_atom] = 0
        pairs_of += np.bincount(sub_atom, minlength=m)
    start = np.cumsum(pairs_of) - pairs_of  # each atom's first pair
    n_pairs = int(pairs_of.sum())
    present = np.empty(n_pairs, dtype=np.int64)
    count = np.empty(n_pairs, dtype=np.int64)
    pure = np.flatnonzero((per_atom > 0) & ~mixed_atom)
    present[start[pure]] = pure * n_cells + one_cell[pure]
    count[start[pure]] = per_atom[pure]
    inverse = start[atom64]
    if sub_key.size:
        sub_atom = sub_key // n_cells
        # rank of each mixed pair within its atom (the pairs of one atom are contiguous, sorted)
        first_of_atom = np.searchsorted(sub_atom, sub_atom, side="left")
        at = start[sub_atom] + np.arange(sub_key.shape[0], dtype=np.int64) - first_of_atom
        present[at] = sub_key
        count[at] = sub_count
        inverse[in_mixed] = at[sub_inverse.reshape(-1)]
    return present, inverse, count


def extend(values: npt.NDArray[np.generic], parent: Int64Array) -> npt.NDArray[np.generic]:
    """An atom-indexed array over the atoms after a split: fresh atoms take their parent's value."""
    if parent.size == 0:
        return values
    return np.concatenate([values, values[parent]])
