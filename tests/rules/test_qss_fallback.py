"""Span mode's fallback to the atoms rule, and the facts an admission records."""

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


def test_above_the_atom_cap_span_falls_back_and_says_so() -> None:
    outputs = _two_margins()
    policy = AuditPolicy(k=10, atom_cap=20)
    state = _admit_all(AuditState.empty(N), outputs[:1], policy)
    result = admit(state, outputs[1], policy)
    assert not result.admitted
    assert result.facts["fallback"] == "atom_cap" and result.facts["rule"] == "atoms"
    assert result.reason is not None and "fell back" in result.reason
    assert "cap" in result.reason
    assert result.smallest_isolated is not None and result.smallest_isolated < 10


def test_admitted_under_the_fallback_the_scope_keeps_the_atoms_rule() -> None:
    policy = AuditPolicy(k=10, atom_cap=2)
    thirds = (np.arange(N) % 3).astype(np.int32)
    result = admit(AuditState.empty(N), [thirds], policy)
    assert result.admitted and result.facts["fallback"] == "atom_cap"
    assert result.state is not None and not result.state.tracks_constraints
    later = admit(result.state, [(np.arange(N) % 2).astype(np.int32)], AuditPolicy(k=10))
    assert later.facts["fallback"] == "no_constraints"
    assert later.admitted  # atoms of about 33 records: the atoms rule admits


def test_state_from_atoms_mode_is_audited_by_the_atoms_rule_in_span_mode() -> None:
    outputs = _two_margins()
    state = _admit_all(AuditState.empty(N), outputs[:1], AuditPolicy(mode=AuditMode.ATOMS, k=10))
    assert not state.tracks_constraints
    result = admit(state, outputs[1], AuditPolicy(k=10))
    assert not result.admitted and result.facts["fallback"] == "no_constraints"
    assert result.reason is not None and "atoms mode" in result.reason


def test_too_many_small_atoms_for_the_triple_search_falls_back() -> None:
    outputs = _two_margins()
    policy = AuditPolicy(k=10, small_atom_cap=3)
    state = _admit_all(AuditState.empty(N), outputs[:1], policy)
    result = admit(state, outputs[1], policy)
    assert not result.admitted and result.facts["fallback"] == "small_atom_cap"
    assert result.reason is not None and "fell back" in result.reason


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
        ):
            assert key in facts
        assert result.state is not None
        assert facts["constraints_after"] == result.state.n_constraints
        state = result.state
    assert state.n_query_sets == 8 + 5 + 1
    # everyone is the sum of either margin: dependent, so not kept as a constraint
    assert state.n_constraints == 8 + 5 - 1
