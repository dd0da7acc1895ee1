"""Refining the atom partition: the atom-by-atom pairing (most atoms meet one cell) against
numpy's sort-based unique, and both refinement paths against each other."""

from __future__ import annotations

import numpy as np
import pytest

from safeaccess.rules.qss import partition
from safeaccess.rules.qss.partition import _pairs_by_atom, refine


def test_pairs_by_atom_equal_the_sorted_unique_pairs() -> None:
    rng = np.random.default_rng(11)
    for _ in range(400):
        m = int(rng.integers(1, 60))
        n_cells = int(rng.integers(1, 9))
        n = int(rng.integers(1, 300))
        # a mix of one-record atoms and atoms with many records
        atom = rng.integers(0, m, n).astype(np.int32)
        cell = rng.integers(0, n_cells, n).astype(np.int32)
        key = atom.astype(np.int64) * n_cells + cell
        want_keys, want_inverse, want_counts = np.unique(
            key, return_inverse=True, return_counts=True
        )
        keys, inverse, counts = _pairs_by_atom(atom, cell, m, n_cells)
        assert np.array_equal(keys, want_keys)
        assert np.array_equal(inverse, want_inverse.reshape(-1))
        assert np.array_equal(counts, want_counts)


def _random_partition(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    m = int(rng.integers(1, n + 1))
    atom_of = rng.integers(0, m, n).astype(np.int32)
    # atom ids 0..m'-1 all used
    _, atom_of = np.unique(atom_of, return_inverse=True)
    atom_of = atom_of.astype(np.int32).reshape(-1)
    sizes = np.bincount(atom_of).astype(np.int64)
    return atom_of, sizes


@pytest.mark.parametrize("seed", range(6))
def test_both_refinement_paths_give_the_same_split(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(40):
        n = int(rng.integers(1, 400))
        atom_of, sizes = _random_partition(rng, n)
        # some arrays over every record (no -1), some with records outside
        low = -1 if rng.random() < 0.7 else 0
        cells = rng.integers(low, int(rng.integers(1, 7)), n).astype(np.int32)
        outside = int(rng.integers(-1, sizes.shape[0]))
        monkeypatch.setattr(partition, "_dense", lambda slots, touched: True)
        dense = refine(atom_of, sizes, outside, cells)
        monkeypatch.setattr(partition, "_dense", lambda slots, touched: False)
        paired = refine(atom_of, sizes, outside, cells)
        for name in ("sizes", "parent", "cell", "labels"):
            assert np.array_equal(getattr(dense, name), getattr(paired, name)), name
        # the records inside: None exactly when the array holds every record
        if bool((cells >= 0).all()):
            assert dense.inside is None and paired.inside is None
        else:
            assert dense.inside is not None and paired.inside is not None
            assert np.array_equal(dense.inside, np.flatnonzero(cells >= 0))
            assert np.array_equal(paired.inside, dense.inside)
        assert (dense.outside, dense.n_before, dense.n_cells) == (
            paired.outside,
            paired.n_before,
            paired.n_cells,
        )
        # the split is a refinement: records share a new atom iff they shared the old atom
        # and the cell
        after = atom_of.copy()
        paired.apply(after)
        pairs = np.stack([atom_of, cells], axis=1)
        _, by_pair = np.unique(pairs, axis=0, return_inverse=True)
        _, by_atom = np.unique(after, return_inverse=True)
        same_pair = by_pair.reshape(-1)[:, None] == by_pair.reshape(-1)[None, :]
        same_atom = by_atom.reshape(-1)[:, None] == by_atom.reshape(-1)[None, :]
        assert np.array_equal(same_pair, same_atom)
        assert np.array_equal(np.bincount(after, minlength=paired.sizes.shape[0]), paired.sizes)


@pytest.mark.parametrize("everyone", [True, False])
def test_an_array_that_splits_no_atom_keeps_every_id(everyone: bool) -> None:
    # A repeated query set, or one coarser than the partition: each atom within one cell. No
    # id changes, and the labels are a new array (the state's own is never written).
    rng = np.random.default_rng(7)
    for _ in range(60):
        n = int(rng.integers(1, 500))
        atom_of, sizes = _random_partition(rng, n)
        m = int(sizes.shape[0])
        of_atom = rng.integers(0 if everyone else -1, int(rng.integers(1, 6)), m)
        cells = of_atom[atom_of].astype(np.int8)
        before = atom_of.copy()
        result = refine(atom_of, sizes, -1, cells)
        inside = np.flatnonzero(cells >= 0)
        assert result.parent.size == 0 and np.array_equal(result.sizes, sizes)
        assert np.array_equal(result.labels, atom_of[inside])
        assert not np.shares_memory(result.labels, atom_of)
        touched = np.unique(atom_of[inside])
        assert np.array_equal(result.cell[touched], of_atom[touched])
        assert np.array_equal(atom_of, before)
        applied, owned = result.applied(atom_of, owned=False)
        assert np.array_equal(applied, before)
        assert owned  # a new array either way (labels of every record, or a copy)
        # A state's array is read-only: handed on as it is, and never owned by the caller.
        frozen = atom_of.copy()
        frozen.setflags(write=False)
        kept = refine(frozen, sizes, -1, cells)
        if kept.inside is None:  # the array holds every record
            assert kept.labels is frozen
            applied, owned = kept.applied(frozen, owned=False)
            assert applied is frozen and not owned
        else:
            assert not np.shares_memory(kept.labels, frozen)
            applied, owned = kept.applied(frozen, owned=False)
            assert owned and not np.shares_memory(applied, frozen)
            assert np.array_equal(applied, before)
