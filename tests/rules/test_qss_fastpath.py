"""The admission fast path's parts against direct computation: the lanes' cross products (one
sparse product), the sketch check of rows every lane drops, the block replacement of kept
columns, and the BLAS thread limit while auditing."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from safeaccess.rules.qss import AuditPolicy, AuditState, admit, constraints, kept, modp
from safeaccess.rules.qss.constraints import Constraints, add_rows


def _dense(c: Constraints) -> np.ndarray:
    a = np.zeros((c.n_rows, c.n_atoms), dtype=np.int64)
    for r in range(c.n_rows):
        a[r, c.indices[c.indptr[r] : c.indptr[r + 1]]] = 1
    return a


def _state(n: int, seed: int) -> tuple[AuditState, np.random.Generator]:
    rng = np.random.default_rng(seed)
    policy = AuditPolicy(k=2)
    state = admit(AuditState.empty(n), [np.zeros(n, np.int32)], policy).state
    assert state is not None
    for _ in range(3):
        cells = rng.integers(0, 3, n).astype(np.int32)
        cells[rng.random(n) < 0.3] = -1
        result = admit(state, [cells], policy)
        if result.admitted:
            assert result.state is not None
            state = result.state
    return state, rng


@pytest.mark.parametrize("limbs", [False, True])
def test_cross_products_equal_the_weighted_intersections(
    limbs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if limbs:  # force the 16-bit limb path that more than 2**22 atoms would take
        monkeypatch.setattr(constraints, "_EXACT_TERMS", 1)
    for seed in range(5):
        state, rng = _state(80, seed)
        c = state.constraints
        assert c is not None and c.n_rows > 1
        new_cells = [rng.integers(-1, 4, c.n_atoms), rng.integers(-1, 2, c.n_atoms)]
        offsets = [0, int(new_cells[0].max()) + 1]
        n_new = offsets[1] + int(new_cells[1].max()) + 1
        new_index = [
            np.where(x >= 0, x + o, -1).astype(np.int64)
            for x, o in zip(new_cells, offsets, strict=True)
        ]
        got = constraints._cross_products(c, new_index, n_new)
        a = _dense(c)
        n_mat = np.zeros((n_new, c.n_atoms), dtype=object)
        for idx in new_index:
            for atom in np.flatnonzero(idx >= 0):
                n_mat[idx[atom], atom] = 1
        for lane, product in zip(c.lanes, got, strict=True):
            # exact integers (Python ints), reduced once at the end
            want = (a.astype(object) * lane.d.astype(object)) @ n_mat.T
            assert np.array_equal(product, (want % lane.p).astype(np.int64))


def test_a_row_every_lane_drops_wrongly_is_caught_by_the_sketches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lane whose random weights hide an independent new row (a chance event) must not make
    the auditor forget it: the sketches disagree with the claimed dependency, and the output is
    refused as unverified, never released."""
    n = 40
    policy = AuditPolicy(k=2)
    state = admit(AuditState.empty(n), [np.zeros(n, np.int32)], policy).state
    assert state is not None
    halves = np.where(np.arange(n) < 20, 0, 1).astype(np.int32)
    c = state.constraints
    assert c is not None
    # the universe's one atom split in two, and the two halves as new rows
    split = c.split(np.zeros(1, np.int64), np.random.default_rng(0))
    atom_cells = np.asarray([0, 1], dtype=np.int32)
    honest = add_rows(split, [atom_cells])
    assert honest.unverified == 0 and honest.constraints.n_rows == c.n_rows + 1
    real_pivots = modp.pivot_columns

    def hide_last(matrix: np.ndarray, p: int) -> list[int]:
        return real_pivots(matrix, p)[:-1]  # every lane "finds" one row fewer

    monkeypatch.setattr(modp, "pivot_columns", hide_last)
    candidate = add_rows(split, [atom_cells])
    assert candidate.constraints.n_rows == c.n_rows  # the independent row was dropped
    assert candidate.unverified >= 1
    refused = admit(state, [halves], policy)
    assert not refused.admitted
    assert refused.facts.get("verification_failed") is True


def test_dependent_rows_pass_the_sketch_check_after_decoding() -> None:
    """A state read back from bytes carries no sketches: fresh ones are drawn, and a repeated
    table (every row dependent) is verified and admitted with its dependencies."""
    n = 50
    policy = AuditPolicy(k=3)
    cells = (np.arange(n) % 4).astype(np.int32)
    state = admit(AuditState.empty(n), [np.zeros(n, np.int32)], policy).state
    assert state is not None
    state = admit(state, [cells], policy).state
    assert state is not None
    decoded = AuditState.from_bytes(state.to_bytes())
    assert decoded.constraints is not None
    assert all(lane.sketch is None for lane in decoded.constraints.lanes)
    again = admit(decoded, [cells], policy)
    assert again.admitted, again.reason
    assert again.facts["new_independent"] == 0
    assert len(again.dependencies) >= 4


def test_block_replacement_keeps_the_inverse_exact() -> None:
    rng = np.random.default_rng(7)
    p = modp.random_prime(1 << 20, modp.SMALL_PRIME_LIMIT)
    size = 14
    filled = 0
    for _ in range(100):
        while True:
            a = (rng.random((size, size)) < 0.4).astype(np.int64)
            inv = modp.invert(a, p)
            if inv is not None:
                break
        candidates = (rng.random((size, 40)) < 0.4).astype(np.float64)
        cols = np.arange(size, dtype=np.int64)
        holes = sorted(rng.choice(size, size=int(rng.integers(1, 6)), replace=False).tolist())
        before = list(holes)
        atoms = np.arange(100, 140, dtype=np.int64)
        free = np.ones(40, dtype=bool)
        new_inv, used = kept._fill_holes(cols, inv, holes, atoms, candidates, free, p)
        replaced = [j for j in before if j not in holes]
        filled += len(replaced)
        assert len(used) == len(replaced) and not free[used].any()
        a2 = a.copy()
        for j in replaced:
            a2[:, j] = candidates[:, cols[j] - 100].astype(np.int64)
        assert np.array_equal(a2 @ new_inv % p, np.eye(size, dtype=np.int64))
    assert filled > 100  # the replacements really happen


def test_admission_runs_with_one_blas_thread_and_restores_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the BLAS libraries numpy loaded (the package's `admit` name is the function)
    controller = importlib.import_module("safeaccess.rules.qss.admit")._BLAS

    def threads() -> list[int]:
        # the BLAS ones only (another test may have loaded an OpenMP runtime, which the auditor
        # does not use and does not limit)
        return [
            int(info["num_threads"]) for info in controller.info() if info["user_api"] == "blas"
        ]

    seen: list[int] = []
    real = modp.matmul

    def spy(a: np.ndarray, b: np.ndarray, p: int) -> np.ndarray:
        seen.extend(threads())
        return real(a, b, p)

    monkeypatch.setattr(modp, "matmul", spy)
    before = threads()
    _state(60, 3)
    assert seen and set(seen) == {1}
    assert threads() == before


@pytest.mark.parametrize("limbs", [False, True])
def test_new_rows_sketches_equal_the_weighted_sums(
    limbs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each new row's sketch (one sparse product for every lane and sketch, or the limb path
    above 2**22 atoms) is Σ of the lane's sketch weights over the row's atoms, mod p."""
    if limbs:
        monkeypatch.setattr(constraints, "_EXACT_TERMS", 1)
    for seed in range(5):
        state, rng = _state(90, seed)
        c = state.constraints
        assert c is not None
        c = c.with_sketch()
        new_cells = [rng.integers(-1, 5, c.n_atoms), rng.integers(-1, 3, c.n_atoms)]
        offsets = [0, int(new_cells[0].max()) + 1]
        n_new = offsets[1] + int(new_cells[1].max()) + 1
        new_index = [
            np.where(x >= 0, x + o, -1).astype(np.int64)
            for x, o in zip(new_cells, offsets, strict=True)
        ]
        inside = [np.flatnonzero(idx >= 0) for idx in new_index]
        got = constraints._new_sketches(c.lanes, new_index, inside, n_new)
        for lane, sums in zip(c.lanes, got, strict=True):
            assert lane.sketch is not None
            want = np.zeros((n_new, constraints.SKETCHES), dtype=object)
            for idx in new_index:
                for atom in np.flatnonzero(idx >= 0):
                    want[idx[atom]] += lane.sketch[atom].astype(object)
            assert np.array_equal(sums, (want % lane.p).astype(np.int64))
