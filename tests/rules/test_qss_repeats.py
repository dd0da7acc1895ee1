"""Rows met before (`repeats.py`): a repeated query set takes its known dependency instead of
the lanes' algebra, with the same verdicts, the same dependencies and the same lanes as the
algebra gives when the auditor remembers nothing."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from safeaccess.rules.qss import AuditPolicy, AuditState, admit, constraints
from safeaccess.rules.qss.admit import Admission


def _forget(state: AuditState) -> AuditState:
    """The same state with no rows remembered (every new row goes through the lanes)."""
    assert state.constraints is not None
    return AuditState(
        atom_of=state.atom_of.copy(),
        sizes=state.sizes.copy(),
        outside=state.outside,
        n_query_sets=state.n_query_sets,
        constraints=replace(state.constraints, seen={}),
    )


def _deps(result: Admission) -> list[tuple[object, ...]]:
    return sorted(
        (d.key, d.p, tuple(int(r) for r in d.rows), tuple(int(c) for c in d.coefficients))
        for d in result.dependencies
    )


def _same(a: Admission, b: Admission) -> None:
    assert a.admitted == b.admitted, (a.reason, b.reason)
    assert a.reason == b.reason
    assert a.kept_keys == b.kept_keys
    assert _deps(a) == _deps(b)
    if a.admitted:
        assert a.state is not None and b.state is not None
        ca, cb = a.state.constraints, b.state.constraints
        assert ca is not None and cb is not None
        assert np.array_equal(ca.indptr, cb.indptr) and np.array_equal(ca.indices, cb.indices)
        dense = np.zeros((ca.n_rows, ca.n_atoms), dtype=object)
        for r in range(ca.n_rows):
            dense[r, ca.indices[ca.indptr[r] : ca.indptr[r + 1]]] = 1
        for la, lb in zip(ca.lanes, cb.lanes, strict=True):
            assert np.array_equal(la.basis, lb.basis)
            # the atom weights are redrawn at every split, so K itself differs between the two
            # runs: each must be M D Mᵀ over its basis, with its exact inverse
            m_rows = dense[la.basis]
            want = (m_rows * la.d.astype(object)) @ m_rows.T % la.p
            assert np.array_equal(la.k_mat.astype(object), want)
            eye = la.k_inv.astype(object) @ la.k_mat.astype(object) % la.p
            assert np.array_equal(eye, np.eye(la.basis.shape[0], dtype=object))


@pytest.mark.parametrize("seed", range(8))
def test_remembering_rows_changes_no_verdict_and_no_dependency(seed: int) -> None:
    """Random sequences with repeats (tables asked again, on the same or another filter): at
    every step the admission with the remembered rows equals the one without."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(80, 200))
    policy = AuditPolicy(k=int(rng.integers(2, 4)))
    columns = [rng.integers(0, levels, n).astype(np.int32) for levels in (2, 3, 3, 2)]
    state = admit(AuditState.empty(n), [np.zeros(n, np.int32)], policy).state
    assert state is not None
    asked: list[list[np.ndarray]] = []
    repeats_seen = 0
    for _ in range(10):
        if asked and rng.random() < 0.5:
            arrays = asked[int(rng.integers(len(asked)))]  # a repeat
        else:
            arrays = []
            for _ in range(int(rng.integers(1, 3))):
                # a table over one or two columns, on everyone or on a filter
                names = rng.choice(3, size=int(rng.integers(1, 3)), replace=False)
                cells = np.zeros(n, np.int32)
                for name in names:
                    cells = cells * 3 + columns[int(name)]
                if rng.random() < 0.5:
                    cells[columns[3] != int(rng.integers(2))] = -1
                arrays.append(cells)
            asked.append(arrays)
        with_memory = admit(state, arrays, policy)
        without = admit(_forget(state), arrays, policy)
        _same(with_memory, without)
        if with_memory.admitted:
            assert with_memory.state is not None
            state = with_memory.state
            repeats_seen += int(bool(with_memory.dependencies))
    assert repeats_seen >= 1  # the sequences did exercise rows met before


def test_a_repeated_table_after_a_split_skips_the_cross_products(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A table asked again after a later output split its atoms: every row is recognised (a split
    keeps every row's sketch), so the lanes' cross products are not computed at all, and its
    dependencies are those the algebra finds."""
    n = 120
    policy = AuditPolicy(k=3)
    rng = np.random.default_rng(5)
    table = (np.arange(n) % 4).astype(np.int32)
    other = rng.integers(0, 3, n).astype(np.int32)
    state = admit(AuditState.empty(n), [np.zeros(n, np.int32)], policy).state
    assert state is not None
    for arrays in ([table], [other]):
        result = admit(state, arrays, policy)
        assert result.admitted, result.reason
        assert result.state is not None
        state = result.state
    calls: list[int] = []
    real = constraints._cross_products

    def counting(
        c: constraints.Constraints, index: list[np.ndarray], n_new: int
    ) -> list[np.ndarray]:
        calls.append(n_new)
        return real(c, index, n_new)

    monkeypatch.setattr(constraints, "_cross_products", counting)
    again = admit(state, [table], policy)
    assert again.admitted and calls == []
    assert len(again.dependencies) >= 4  # each of the four cells, in each full lane
    monkeypatch.setattr(constraints, "_cross_products", real)
    _same(again, admit(_forget(state), [table], policy))


def test_a_decoded_state_recognises_its_kept_rows_but_no_dropped_one() -> None:
    """Sketches are not encoded: a decoded state draws fresh ones and remembers its kept rows by
    them; the rows found dependent before are forgotten (their keys used the old sketches)."""
    n = 60
    policy = AuditPolicy(k=3)
    cells = (np.arange(n) % 3).astype(np.int32)
    state = admit(AuditState.empty(n), [np.zeros(n, np.int32)], policy).state
    assert state is not None
    state = admit(state, [cells], policy).state  # three rows, one dependent (sum = universe)
    assert state is not None and state.constraints is not None
    assert len(state.constraints.seen) == state.constraints.n_rows + 1
    decoded = AuditState.from_bytes(state.to_bytes())
    assert decoded.constraints is not None and not decoded.constraints.seen
    again = admit(decoded, [cells], policy)
    assert again.admitted and again.state is not None and again.state.constraints is not None
    _same(again, admit(_forget(decoded), [cells], policy))
    seen = again.state.constraints.seen
    assert sorted(v for v in seen.values() if isinstance(v, int)) == list(
        range(again.state.constraints.n_rows)
    )
