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


def test_atoms_mode_keeps_constraints_and_reports_dependencies() -> None:
    # the atoms rule on top of the span audit: the state keeps its constraints, so a repeat
    # the records alone imply reaches the server's data-revealed-zero check in this mode too
    outputs = _two_margins()
    policy = AuditPolicy(mode=AuditMode.ATOMS, k=10)
    state = _admit_all(AuditState.empty(N), outputs[:1], policy)
    assert state.tracks_constraints and state.n_constraints == 8
    again = admit(state, outputs[0], policy)
    assert again.admitted and again.facts["rule"] == "atoms"
    assert {d.key for d in again.dependencies} == {(0, cell) for cell in range(8)}
    assert not admit(state, outputs[1], policy).admitted  # small atoms: the atoms rule


def _without_constraints(state: AuditState) -> AuditState:
    """`state` as atoms mode stored it before it kept constraints."""
    return AuditState(state.atom_of, state.sizes, state.outside, state.n_query_sets, None)


def test_state_without_constraints_is_audited_by_the_atoms_rule_in_span_mode() -> None:
    outputs = _two_margins()
    state = _admit_all(AuditState.empty(N), outputs[:1], AuditPolicy(mode=AuditMode.ATOMS, k=10))
    state = _without_constraints(state)
    result = admit(state, outputs[1], AuditPolicy(k=10))
    assert not result.admitted and result.facts["fallback"] == "no_constraints"
    assert result.reason is not None and "atoms mode" in result.reason


def test_without_constraints_a_cell_that_splits_nothing_is_refused_too() -> None:
    # Its "no" branch (a union of earlier atoms) refused like the "yes" branch (a small atom):
    # such a state cannot tell a repeat from a zero only the records reveal.
    outputs = _two_margins()
    state = _admit_all(AuditState.empty(N), outputs[:1], AuditPolicy(mode=AuditMode.ATOMS, k=10))
    state = _without_constraints(state)
    for mode in (AuditMode.ATOMS, AuditMode.SPAN):
        repeat = admit(state, outputs[0], AuditPolicy(mode=mode, k=10))
        assert not repeat.admitted and repeat.facts["unsplit_cell"]
        assert repeat.reason is not None and "no oracle" in repeat.reason
        # every cell splits an atom into pieces of k or more: released
        halves = (np.arange(N) % 2).astype(np.int32)
        assert admit(state, [halves], AuditPolicy(mode=mode, k=5)).admitted


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
