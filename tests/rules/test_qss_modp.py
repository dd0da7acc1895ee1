"""The incremental column basis against exact elimination over Python integers: the columns it
adds are the greedy independent ones in order, and its vectors stay a fully reduced basis of
their span."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import numpy.typing as npt
import pytest

from safeaccess.rules.qss import modp


def _rank(columns: list[list[int]], p: int) -> int:
    """Rank mod p by elimination over Python integers (no numpy arithmetic)."""
    rows = [list(r) for r in zip(*columns, strict=True)] if columns else []
    rank, n_cols = 0, len(columns)
    for c in range(n_cols):
        pivot = next((i for i in range(rank, len(rows)) if rows[i][c] % p), None)
        if pivot is None:
            continue
        rows[rank], rows[pivot] = rows[pivot], rows[rank]
        inv = pow(rows[rank][c], p - 2, p)
        rows[rank] = [x * inv % p for x in rows[rank]]
        for i in range(len(rows)):
            if i != rank and rows[i][c] % p:
                f = rows[i][c]
                rows[i] = [(x - f * y) % p for x, y in zip(rows[i], rows[rank], strict=True)]
        rank += 1
    return rank


class _Echelon:
    """The span of the columns taken so far, by elimination over Python integers: a column is
    independent iff its residual is not zero (O(n²) a column, for the larger cases)."""

    def __init__(self, p: int) -> None:
        self.p = p
        self.rows: list[tuple[int, list[int]]] = []  # (pivot, vector with 1 there)

    def residual(self, column: list[int]) -> list[int]:
        v = [x % self.p for x in column]
        for pivot, row in self.rows:
            if v[pivot]:
                f = v[pivot]
                v = [(x - f * y) % self.p for x, y in zip(v, row, strict=True)]
        return v

    def take(self, column: list[int]) -> bool:
        v = self.residual(column)
        pivot = next((i for i, x in enumerate(v) if x), None)
        if pivot is None:
            return False
        inv = pow(v[pivot], self.p - 2, self.p)
        self.rows.append((pivot, [x * inv % self.p for x in v]))
        return True


def _batch(rng: np.random.Generator, n: int, width: int, p: int) -> npt.NDArray[np.int64]:
    """Low-rank weighted batches (repeated and combined columns), 0/1 columns like atoms, and
    raw integers outside [0, p) (taken mod p)."""
    kind = rng.random()
    if kind < 0.4:
        base = rng.integers(0, p, size=(n, max(1, width // 3)))
        mix = rng.integers(0, 3, size=(base.shape[1], width))
        return (base.astype(object) @ mix.astype(object) % p).astype(np.int64)
    if kind < 0.8:
        return rng.integers(0, 2, size=(n, width)).astype(np.int64)
    if kind < 0.9:
        return rng.integers(0, p, size=(n, width)).astype(np.int64)
    return rng.integers(-3 * p, 3 * p, size=(n, width)).astype(np.int64)


@pytest.mark.parametrize(
    ("p", "largest"),
    # 2**20 < p < 2**21 (the search's first prime: reductions mod p are rare), p near 2**29
    # (a reduction every 32 vectors a column meets) and 2**31 − 1 (every second)
    [(1_048_583, 8), (1_048_583, 48), (536_870_909, 48), (2_147_483_647, 8), (2_147_483_647, 40)],
)
def test_insert_adds_the_greedy_independent_columns_and_keeps_a_reduced_basis(
    p: int, largest: int
) -> None:
    """The compiled insert (`eliminate.py`) against elimination over Python integers, on random
    0/1, weighted and low-rank batches, several batches a basis."""
    rng = np.random.default_rng(p % 1000 + largest)
    for _ in range(60 if largest <= 8 else 12):
        n = int(rng.integers(1, largest + 1))
        basis = modp.ColumnBasis(n, p, capacity=int(rng.integers(1, n + 1)))
        exact = _Echelon(p)
        taken: list[list[int]] = []
        for _ in range(int(rng.integers(1, 5))):
            width = int(rng.integers(1, max(12, 2 * n)))
            batch = _batch(rng, n, width, p)
            added = basis.insert(batch.copy())
            want: list[int] = []
            for j in range(width):
                column = [int(x) % p for x in batch[:, j]]
                if exact.take(column):
                    taken.append(column)
                    want.append(j)
            assert added == want
            vectors = basis.vectors
            assert basis.rank == len(exact.rows)
            assert np.array_equal(vectors[basis.pivots, :], np.eye(basis.rank, dtype=np.int64))
            assert int(vectors.min(initial=0)) >= 0 and int(vectors.max(initial=0)) < p
            # the vectors lie in the span of the columns taken, and are as many as its rank
            for i in range(basis.rank):
                assert not any(exact.residual([int(x) for x in vectors[:, i]]))
            if n <= 8:
                both = taken + [[int(x) for x in vectors[:, i]] for i in range(basis.rank)]
                assert _rank(both, p) == basis.rank == _rank(taken, p)


def test_insert_reduces_other_columns_to_zero_exactly_when_in_the_span() -> None:
    """`reduce` after inserts: zero exactly for the columns in the span (brute force)."""
    p = 2_147_483_647
    rng = np.random.default_rng(41)
    n = 30
    basis = modp.ColumnBasis(n, p)
    exact = _Echelon(p)
    spanning = _batch(rng, n, 20, p)
    basis.insert(spanning)
    for j in range(spanning.shape[1]):
        exact.take([int(x) for x in spanning[:, j]])
    probes = np.concatenate([spanning[:, :5] * 3 % p, _batch(rng, n, 10, p) % p], axis=1)
    residues = basis.reduce(probes)
    for j in range(probes.shape[1]):
        inside = not any(exact.residual([int(x) for x in probes[:, j]]))
        assert inside == (not residues[:, j].any())


def test_the_compiled_elimination_imports_where_no_cache_directory_is_writable() -> None:
    """A read-only deployment (no writable cache directory for numba, here: no cache locator
    that accepts the module) compiles in memory instead of failing at import."""
    code = (
        "import numpy as np\n"
        "from safeaccess.rules.qss import modp\n"
        "basis = modp.ColumnBasis(3, 7)\n"
        "print(basis.insert(np.array([[1, 2, 0], [0, 0, 1], [1, 2, 1]], dtype=np.int64)))\n"
    )
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "numba.core.caching.IPythonCacheLocator"}
    env.pop("NUMBA_CACHE_DIR", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 2]"
