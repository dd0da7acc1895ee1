"""The auditor against brute force on small random sequences: every signed combination of any
number of atoms (exact rational rank over every small support), and the atoms rule."""

from __future__ import annotations

import numpy as np
import pytest
from _qss_oracle import atoms_of, query_sets_of, smallest_determined_combination
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safeaccess.rules.qss import AuditMode, AuditPolicy, AuditState, admit

MAX_ATOMS = 14
pytestmark = pytest.mark.slow


@st.composite
def sequences(draw: st.DrawFn) -> tuple[int, int, list[list[np.ndarray]]]:
    n = draw(st.integers(4, 24))
    k = draw(st.integers(2, 6))
    outputs = []
    for _ in range(draw(st.integers(1, 5))):
        arrays = []
        for _ in range(draw(st.integers(1, 2))):
            n_cells = draw(st.integers(1, 3))
            cells = draw(st.lists(st.integers(-1, n_cells - 1), min_size=n, max_size=n))
            arrays.append(np.asarray(cells, dtype=np.int32))
        outputs.append(arrays)
    return n, k, outputs


def _run(mode: AuditMode, n: int, k: int, outputs: list[list[np.ndarray]]) -> None:
    policy = AuditPolicy(mode=mode, k=k)
    state = AuditState.empty(n)
    admitted_sets: list[frozenset[int]] = []
    for arrays in outputs:
        trial = admitted_sets + query_sets_of(arrays)
        if len(atoms_of(n, trial)) > MAX_ATOMS:
            return
        result = admit(state, arrays, policy)
        atoms = atoms_of(n, trial)
        if mode is AuditMode.ATOMS:
            smallest = min(len(a) for a in atoms)
            assert result.admitted == (smallest >= k)
            if not result.admitted:
                assert result.smallest_isolated == smallest
        else:
            smallest = smallest_determined_combination(n, trial, k)
            if smallest is not None:
                assert not result.admitted, f"missed a determined combination of {smallest}"
                # the auditor names a determined support, not always the smallest one
                assert result.smallest_isolated is not None
                assert smallest <= result.smallest_isolated < k
            else:
                assert result.admitted, result.reason
        assert result.state is None or result.state.n_atoms == len(atoms)
        if result.admitted:
            assert result.state is not None
            state = result.state
            admitted_sets = trial


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequences())
def test_span_mode_matches_brute_force(case: tuple[int, int, list[list[np.ndarray]]]) -> None:
    _run(AuditMode.SPAN, *case)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequences())
def test_atoms_mode_matches_brute_force(case: tuple[int, int, list[list[np.ndarray]]]) -> None:
    _run(AuditMode.ATOMS, *case)
