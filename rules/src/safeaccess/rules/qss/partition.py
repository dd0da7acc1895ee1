"""Refining the atom partition of record ids by one query-set array, touching only its records.

An atom is a maximal set of record ids with the same membership in every admitted query set.
Refining by a new array (one cell index per record, -1 outside) splits each atom into the records
of each cell it meets plus the remainder outside the array. Atom ids stay stable: an atom keeps
its id for its untouched remainder (or, when every record of it is inside, for its first piece),
and the other pieces get fresh ids appended at the end, so records outside the new array are
never rewritten and nothing of size n_records is sorted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Int32Array = npt.NDArray[np.int32]
Int64Array = npt.NDArray[np.int64]

# Above this many (atom, cell) key slots, and above 4 slots per touched record, the combined key
# is relabelled by sorting the touched records instead of counting into a dense table: a table
# much larger than the records costs more to allocate and scan than the sort (200 000 records
# over 194 000 atoms by 40 cells: 64 ms dense, 16 ms sorted), while 10 M records over a few
# thousand atoms stay dense.
_DENSE_KEY_SLOTS = 1 << 20


@dataclass(frozen=True)
class Refinement:
    """What one array did to the partition. The records `inside` it get atom ids `labels`
    (the caller applies them with `apply`, only once the output is admitted).

    `sizes` covers the new atom ids; `parent` maps each fresh id (from `n_before` on) to the atom
    it split from; `cell` is the array's cell index for every atom after the split (-1 outside)."""

    sizes: Int64Array
    parent: Int64Array
    cell: Int32Array
    outside: int
    n_before: int
    n_cells: int
    inside: Int64Array
    labels: Int32Array

    def apply(self, atom_of: Int32Array) -> None:
        atom_of[self.inside] = self.labels


def refine(atom_of: Int32Array, sizes: Int64Array, outside: int, cells: Int32Array) -> Refinement:
    """Split the atoms of `atom_of` (left unchanged) by the query-set array `cells`."""
    m = int(sizes.shape[0])
    inside = np.flatnonzero(cells >= 0)
    if inside.size == 0:
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
    inner = cells[inside]
    n_cells = int(inner.max()) + 1
    slots = m * n_cells
    # int32 keys when they fit: half the memory traffic on the hot path (10 M records)
    key_type = np.dtype(np.int32 if slots < np.iinfo(np.int32).max else np.int64)
    key: npt.NDArray[np.signedinteger[Any]] = atom_of[inside].astype(key_type, copy=False)
    key = key * n_cells
    key += inner.astype(key_type, copy=False)
    inverse: Int64Array | None = None
    if slots <= max(_DENSE_KEY_SLOTS, 4 * int(inside.size)):
        counts = np.bincount(key, minlength=slots)
        present = np.flatnonzero(counts).astype(np.int64)
        pair_count = counts[present].astype(np.int64)
    else:
        present, inverse_raw, pair_count = np.unique(key, return_inverse=True, return_counts=True)
        inverse = inverse_raw.astype(np.int64)
        pair_count = pair_count.astype(np.int64)
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
    if inverse is None:
        lut = np.empty(slots, dtype=np.int32)
        lut[present] = new_id
        labels = lut[key]
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
        inside=inside.astype(np.int64, copy=False),
        labels=labels,
    )


def extend(values: npt.NDArray[np.generic], parent: Int64Array) -> npt.NDArray[np.generic]:
    """An atom-indexed array over the atoms after a split: fresh atoms take their parent's value."""
    if parent.size == 0:
        return values
    return np.concatenate([values, values[parent]])
