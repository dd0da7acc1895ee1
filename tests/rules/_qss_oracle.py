"""Brute force for the query-set auditor: exact rational row reduction over atoms and every union
of atoms, for small cases. Independent of the auditor's code (no shared helpers)."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from itertools import combinations

import numpy as np


def query_sets_of(arrays: Sequence[np.ndarray]) -> list[frozenset[int]]:
    """Each distinct cell of each array as the set of record ids behind it."""
    out = []
    for array in arrays:
        for c in sorted(set(int(x) for x in array if x >= 0)):
            out.append(frozenset(int(r) for r in np.flatnonzero(array == c)))
    return out


def atoms_of(n: int, sets: Sequence[frozenset[int]]) -> list[frozenset[int]]:
    groups: dict[tuple[bool, ...], set[int]] = {}
    for r in range(n):
        groups.setdefault(tuple(r in s for s in sets), set()).add(r)
    return [frozenset(g) for g in groups.values()]


class RowSpace:
    """Rational row space of query sets over atoms, in reduced row echelon form."""

    def __init__(self, sets: Sequence[frozenset[int]], atoms: Sequence[frozenset[int]]) -> None:
        self.m = len(atoms)
        rows = [[Fraction(1 if atom <= s else 0) for atom in atoms] for s in sets]
        for s, row in zip(sets, rows, strict=True):  # query sets are unions of atoms
            assert sum(len(a) for a, x in zip(atoms, row, strict=True) if x) == len(s)
        self.pivots: list[tuple[int, list[Fraction]]] = []
        for row in rows:
            reduced = self._reduce(row)
            col = next((j for j, x in enumerate(reduced) if x != 0), None)
            if col is None:
                continue
            lead = reduced[col]
            reduced = [x / lead for x in reduced]
            self.pivots = [
                (c, [a - r[col] * b for a, b in zip(r, reduced, strict=True)])
                for c, r in self.pivots
            ]
            self.pivots.append((col, reduced))

    def _reduce(self, row: list[Fraction]) -> list[Fraction]:
        row = list(row)
        for col, pivot in self.pivots:
            if row[col] != 0:
                f = row[col]
                row = [a - f * b for a, b in zip(row, pivot, strict=True)]
        return row

    def contains(self, indicator: Sequence[int]) -> bool:
        return all(x == 0 for x in self._reduce([Fraction(v) for v in indicator]))


def determined_small_unions(
    n: int, sets: Sequence[frozenset[int]], k: int, max_atoms: int | None = None
) -> list[tuple[int, int]]:
    """(total records, number of atoms) of every determined non-empty union of atoms with fewer
    than k records (unions of at most max_atoms atoms when given)."""
    atoms = atoms_of(n, sets)
    space = RowSpace(sets, atoms)
    found = []
    top = len(atoms) if max_atoms is None else min(max_atoms, len(atoms))
    for size in range(1, top + 1):
        for combo in combinations(range(len(atoms)), size):
            total = sum(len(atoms[i]) for i in combo)
            if total >= k:
                continue
            indicator = [1 if i in combo else 0 for i in range(len(atoms))]
            if space.contains(indicator):
                found.append((total, size))
    return found
