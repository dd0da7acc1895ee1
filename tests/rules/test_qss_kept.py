"""The certificate kept across admissions (`kept.py`) against a decision from scratch.

On random admission sequences every output is admitted twice from the same state: once with the
kept completing sets (the incremental path), once with them dropped (so `decide` runs from
scratch). Both must give the same verdict, and every kept family must really be a certificate:
each A[:, cols] times its stored inverse is the identity mod p, over every admitted row, and the
small parts are pairwise disjoint."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from safeaccess.rules.qss import AuditPolicy, AuditState, admit
from safeaccess.rules.qss.state import AuditState as State


def _dense(state: AuditState) -> np.ndarray:
    c = state.constraints
    assert c is not None
    a = np.zeros((c.n_rows, c.n_atoms), dtype=np.int64)
    for r in range(c.n_rows):
        a[r, c.indices[c.indptr[r] : c.indptr[r + 1]]] = 1
    return a


def _check_kept(state: AuditState, k: int) -> bool:
    """Whether the state carries kept sets; asserts they are an exact certificate."""
    c = state.constraints
    assert c is not None
    kept = c.kept
    if kept is None:
        return False
    assert kept.n_rows == c.n_rows
    a = _dense(state)
    for cols, inv in zip(kept.cols, kept.inv, strict=True):
        assert cols.shape == (c.n_rows,)
        product = (a[:, cols] @ inv) % kept.p
        assert np.array_equal(product, np.eye(c.n_rows, dtype=np.int64))
    small = [cols[state.sizes[cols] < k] for cols in kept.cols]
    joined = np.concatenate(small) if small else np.empty(0, np.int64)
    assert np.unique(joined).size == joined.size or any(s.size == 0 for s in small)
    assert kept.certifies(state.sizes, k)
    return True


def _without_kept(state: AuditState) -> AuditState:
    c = state.constraints
    assert c is not None
    return State(state.atom_of.copy(), state.sizes.copy(), state.outside, state.n_query_sets,
                 replace(c, kept=None))  # fmt: skip


def _outputs(rng: np.random.Generator, n: int) -> list[list[np.ndarray]]:
    columns = [rng.integers(0, int(rng.integers(2, 6)), n) for _ in range(5)]
    outputs = []
    for _ in range(int(rng.integers(3, 9))):
        arrays = []
        for _ in range(int(rng.integers(1, 3))):
            a, b = rng.choice(5, 2, replace=False)
            cells = (columns[a] * 6 + columns[b]).astype(np.int32)
            if rng.random() < 0.5:
                cells[rng.random(n) < rng.uniform(0.1, 0.6)] = -1  # a filter
            if rng.random() < 0.2:
                cells[rng.integers(0, n)] = -1  # "everyone but one"-like probes
            arrays.append(cells)
        outputs.append(arrays)
    return outputs


@pytest.mark.parametrize("block", range(5))
def test_kept_and_scratch_decisions_agree(block: int) -> None:
    used = 0
    for seed in range(block * 35, block * 35 + 35):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(60, 400))
        k = int(rng.integers(2, 6))
        policy = AuditPolicy(k=k)
        state = admit(AuditState.empty(n), [np.zeros(n, np.int32)], policy).state
        assert state is not None
        for arrays in _outputs(rng, n):
            incremental = admit(state, arrays, policy)
            scratch = admit(_without_kept(state), arrays, policy)
            costly = incremental.facts.get("cost") or scratch.facts.get("cost")
            if not costly:  # a refusal for cost (a bounded randomised search) decides nothing
                assert incremental.admitted == scratch.admitted, (seed, incremental.reason)
            elif incremental.admitted:
                # certified by the kept sets: the scratch search must not find a combination
                assert scratch.facts.get("certificate", {}).get("verdict") != "determined"
            if incremental.facts.get("certificate", {}).get("kept"):
                used += 1
            if incremental.admitted:
                assert incremental.state is not None
                state = incremental.state
                _check_kept(state, k)
    # the incremental path must really be exercised, not always fall back
    assert used > 20
