"""Brute force for the query-set auditor: exact rational row reduction over atoms and every union
of atoms, for small cases. Independent of the auditor's code (no shared helpers)."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from itertools import combinations
from math import lcm

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


def null_rows(
    sets: Sequence[frozenset[int]], atoms: Sequence[frozenset[int]]
) -> list[tuple[Fraction, ...]]:
    """Row a of an exact basis of the null space of the query sets over atoms: a set S of atoms is
    determined exactly when its rows sum to zero."""
    space = RowSpace(sets, atoms)
    pivot_cols = {col for col, _ in space.pivots}
    free = [j for j in range(space.m) if j not in pivot_cols]
    rows: list[tuple[Fraction, ...]] = [tuple(Fraction(0) for _ in free) for _ in range(space.m)]
    for i, f in enumerate(free):
        rows[f] = tuple(Fraction(1 if t == i else 0) for t in range(len(free)))
    for col, pivot in space.pivots:
        rows[col] = tuple(-pivot[f] for f in free)
    # scale each basis vector to integers (sums vanish exactly when they did): faster hashing
    scales = [lcm(*(row[t].denominator for row in rows)) for t in range(len(free))]
    return [tuple(Fraction(int(x * c)) for x, c in zip(row, scales, strict=True)) for row in rows]


def smallest_determined_up_to_three(n: int, sets: Sequence[frozenset[int]], k: int) -> int | None:
    """Records in the smallest determined union of at most three atoms below k (None if none),
    by exact hashing of null-space rows (fast enough for a few hundred atoms)."""
    atoms = atoms_of(n, sets)
    rows = [tuple(int(x) for x in row) for row in null_rows(sets, atoms)]
    size = [len(a) for a in atoms]
    zero = tuple(0 for _ in rows[0]) if rows else ()
    best: int | None = None
    small = [i for i in range(len(atoms)) if size[i] < k]
    by_row: dict[tuple[int, ...], list[int]] = {}
    for i in small:
        if rows[i] == zero:
            best = size[i] if best is None else min(best, size[i])
        by_row.setdefault(rows[i], []).append(i)
    for a_pos, a in enumerate(small):
        neg = tuple(-x for x in rows[a])
        for b in by_row.get(neg, []):
            if b != a and size[a] + size[b] < k:
                best = size[a] + size[b] if best is None else min(best, size[a] + size[b])
        for b in small[a_pos + 1 :]:
            if size[a] + size[b] >= k - 1:
                continue
            target = tuple(-x - y for x, y in zip(rows[a], rows[b], strict=True))
            for c in by_row.get(target, []):
                if c not in (a, b) and size[a] + size[b] + size[c] < k:
                    total = size[a] + size[b] + size[c]
                    best = total if best is None else min(best, total)
    return best


def _rational_rank(rows: Sequence[Sequence[Fraction]]) -> int:
    """Rank over the rationals by plain Gaussian elimination."""
    work = [list(r) for r in rows if any(x != 0 for x in r)]
    rank = 0
    n_cols = len(work[0]) if work else 0
    for col in range(n_cols):
        pivot = next((i for i in range(rank, len(work)) if work[i][col] != 0), None)
        if pivot is None:
            continue
        work[rank], work[pivot] = work[pivot], work[rank]
        lead = work[rank][col]
        for i in range(len(work)):
            if i != rank and work[i][col] != 0:
                f = work[i][col] / lead
                work[i] = [a - f * b for a, b in zip(work[i], work[rank], strict=True)]
        rank += 1
    return rank


def smallest_support(rows: Sequence[Sequence[int]], sizes: Sequence[int], k: int) -> int | None:
    """Records in the smallest support of a nonzero rational combination of `rows` (over atoms
    of these sizes), any signs and any number of atoms, below k (None if there is none).

    By brute force over every set S of atoms with fewer than k records: some nonzero combination
    is supported inside S exactly when the columns outside S have lower rank than all columns."""
    matrix = [[Fraction(x) for x in row] for row in rows]
    full = _rational_rank(matrix)
    small = [i for i in range(len(sizes)) if sizes[i] < k]
    best: int | None = None
    for count in range(1, len(small) + 1):
        for combo in combinations(small, count):
            total = sum(sizes[i] for i in combo)
            if total >= k or (best is not None and total >= best):
                continue
            outside = [j for j in range(len(sizes)) if j not in combo]
            if _rational_rank([[row[j] for j in outside] for row in matrix]) < full:
                best = total
    return best


def smallest_determined_combination(n: int, sets: Sequence[frozenset[int]], k: int) -> int | None:
    """`smallest_support` for query sets over n records (their atoms computed here)."""
    atoms = atoms_of(n, sets)
    rows = [[1 if atom <= s else 0 for atom in atoms] for s in sets]
    return smallest_support(rows, [len(a) for a in atoms], k)
