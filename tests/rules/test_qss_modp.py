"""The incremental column basis against exact elimination over Python integers: the columns it
adds are the greedy independent ones in order, and its vectors stay a fully reduced basis of
their span."""

from __future__ import annotations

import numpy as np
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


@pytest.mark.parametrize("block", [64, 3])
@pytest.mark.parametrize("p", [1_048_583, 2_147_483_647])
def test_insert_adds_the_greedy_independent_columns_and_keeps_a_reduced_basis(
    p: int, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`block` 3: a batch spans several blocks (each reduced by the new vectors of the blocks
    before it)."""
    monkeypatch.setattr(modp, "_INSERT_BLOCK", block)
    rng = np.random.default_rng(p % 1000 + block)
    for _ in range(60):
        n = int(rng.integers(1, 9))
        basis = modp.ColumnBasis(n, p, capacity=int(rng.integers(1, n + 1)))
        taken: list[list[int]] = []
        for _ in range(int(rng.integers(1, 5))):
            width = int(rng.integers(1, 12))
            # low-rank batches (repeated and combined columns) and 0/1 columns, like atoms
            if rng.random() < 0.5:
                base = rng.integers(0, p, size=(n, max(1, width // 3)))
                mix = rng.integers(0, 3, size=(base.shape[1], width))
                batch = (base.astype(object) @ mix.astype(object) % p).astype(np.int64)
            else:
                batch = rng.integers(0, 2, size=(n, width)).astype(np.int64)
            added = basis.insert(batch.copy())
            want: list[int] = []
            for j in range(width):
                trial = [*taken, [int(x) for x in batch[:, j]]]
                if _rank(trial, p) > _rank(taken, p):
                    taken = trial
                    want.append(j)
            assert added == want
            vectors = basis.vectors
            assert basis.rank == _rank(taken, p)
            assert np.array_equal(vectors[basis.pivots, :], np.eye(basis.rank, dtype=np.int64))
            # the vectors span exactly the columns taken
            both = taken + [[int(x) for x in vectors[:, i]] for i in range(basis.rank)]
            assert _rank(both, p) == basis.rank
