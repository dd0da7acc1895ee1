"""Span mode's refusals for cost (named, never a silent switch of rule), the atoms rule for states
admitted under atoms mode, and the facts an admission records."""

from __future__ import annotations

import json

import numpy as np

from safeaccess.rules.qss import AuditMode, AuditPolicy, AuditState, admit

N = 200


def _two_margins() -> list[list[np.ndarray]]:
    """Two overlapping margins that leave atoms below k=10 but determine nothing small."""
    r = np.random.default_rng(3)
    a, b = r.integers(0, 8, N), r.integers(0, 5, N)
    return [[a.astype(np.int32)], [b.astype(np.int32)]]


def _admit_all(
    state: AuditState, outputs: list[list[np.ndarray]], policy: AuditPolicy
) -> AuditState:
    for arrays in outputs:
        result = admit(state, arrays, policy)
        assert result.admitted, result.reason
        assert result.state is not None
        state = result.state
    return state


def test_span_admits_what_atoms_refuses_below_the_cap() -> None:
    outputs = _two_margins()
    state = _admit_all(AuditState.empty(N), outputs[:1], AuditPolicy(k=10))
    span = admit(state, outputs[1], AuditPolicy(k=10))
    atoms = admit(state, outputs[1], AuditPolicy(mode=AuditMode.ATOMS, k=10))
    assert span.admitted and span.facts["rule"] == "span" and span.facts["fallback"] is None
    assert not atoms.admitted and atoms.facts["rule"] == "atoms"


def test_above_the_atom_cap_span_refuses_for_cost_and_says_so() -> None:
    outputs = _two_margins()
    policy = AuditPolicy(k=10, atom_cap=20)
    state = _admit_all(AuditState.empty(N), outputs[:1], policy)
    result = admit(state, outputs[1], policy)
    assert not result.admitted and result.state is None
    assert result.facts["cost"] == "atom_cap" and result.facts["rule"] == "span"
    assert result.facts["fallback"] is None
    assert result.reason is not None and result.reason.startswith("refused for cost")
    assert "atom cap (20)" in result.reason
    # nothing changed: a coarser output is still audited by the span criterion
    coarse = admit(state, [(np.arange(N) % 2).astype(np.int32)], policy)
    assert coarse.admitted and coarse.facts["rule"] == "span"


def test_past_its_branch_budget_the_exact_search_refuses_for_cost() -> None:
    """Four people in four atoms, then everyone but them: the certificate cannot be completed,
    so the exact search runs; with a budget of one branch it stops and refuses, named."""
    rng = np.random.default_rng(3)
    everyone = np.zeros(N, dtype=np.int32)

    def cells(members: list[int]) -> np.ndarray:
        array = np.full(N, -1, dtype=np.int32)
        array[members] = 0
        return array

    pool = np.arange(4, N)
    d_set = [int(x) for x in rng.choice(pool, 80, replace=False)]
    e_set = [int(x) for x in rng.choice(pool, 80, replace=False)]
    state = _admit_all(
        AuditState.empty(N),
        [[everyone], [cells([*d_set, 0, 1])], [cells([*e_set, 0, 2])]],
        AuditPolicy(k=10),
    )
    last = [cells(list(range(4, N)))]
    capped = admit(state, last, AuditPolicy(k=10, search_nodes=1))
    assert not capped.admitted and capped.facts["cost"] == "search_nodes"
    assert capped.reason is not None and "exceeded its budget of 1 branch(es)" in capped.reason
    exact = admit(state, last, AuditPolicy(k=10))
    assert not exact.admitted and "cost" not in exact.facts
    assert exact.smallest_isolated == 4


def test_state_from_atoms_mode_is_audited_by_the_atoms_rule_in_span_mode() -> None:
    outputs = _two_margins()
    state = _admit_all(AuditState.empty(N), outputs[:1], AuditPolicy(mode=AuditMode.ATOMS, k=10))
    assert not state.tracks_constraints
    result = admit(state, outputs[1], AuditPolicy(k=10))
    assert not result.admitted and result.facts["fallback"] == "no_constraints"
    assert result.reason is not None and "atoms mode" in result.reason


def test_facts_are_json_and_name_what_was_decided() -> None:
    outputs = _two_margins()
    state = AuditState.empty(N)
    for arrays in [*outputs, [np.zeros(N, dtype=np.int32)]]:
        result = admit(state, arrays, AuditPolicy(k=10))
        facts = json.loads(json.dumps(result.facts))
        for key in (
            "mode",
            "rule",
            "atoms_before",
            "atoms_after",
            "constraints_before",
            "constraints_after",
            "new_query_sets",
            "fallback",
            "smallest_isolated",
            "origin",
            "certificate",
        ):
            assert key in facts
        assert result.state is not None
        assert facts["constraints_after"] == result.state.n_constraints
        state = result.state
    assert state.n_query_sets == 8 + 5 + 1
    # everyone is the sum of either margin: dependent, so not kept as a constraint
    assert state.n_constraints == 8 + 5 - 1
