"""The sequence and step state machines."""

from __future__ import annotations

import itertools

import pytest

from safeaccess.server.states import (
    SEQUENCE_TRANSITIONS,
    STEP_TRANSITIONS,
    IllegalTransition,
    SequenceState,
    StepState,
    check_sequence_transition,
    check_step_transition,
    sequence_state_after_step,
)

# The allowed moves written out by hand from the design, independently of the tables.
ALLOWED_SEQUENCE = {
    ("opened", "running"),
    ("opened", "awaiting_approval"),
    ("awaiting_approval", "running"),
    ("awaiting_approval", "aborted"),
    ("running", "released"),
    ("running", "finished"),
    ("running", "review"),
    ("running", "aborted"),
    ("released", "running"),
    ("review", "released"),
    ("review", "finished"),
    ("review", "aborted"),
}
ALLOWED_STEP = {
    ("pending", "running"),
    ("pending", "withheld"),
    ("running", "released"),
    ("running", "withheld"),
    ("running", "review"),
    ("running", "failed"),
    ("review", "released"),
    ("review", "withheld"),
}


@pytest.mark.parametrize(
    ("current", "target"), list(itertools.product(SequenceState, SequenceState))
)
def test_sequence_transitions_are_exactly_the_designed_ones(
    current: SequenceState, target: SequenceState
) -> None:
    if (current.value, target.value) in ALLOWED_SEQUENCE:
        check_sequence_transition(current, target)
    else:
        with pytest.raises(IllegalTransition):
            check_sequence_transition(current, target)


@pytest.mark.parametrize(("current", "target"), list(itertools.product(StepState, StepState)))
def test_step_transitions_are_exactly_the_designed_ones(
    current: StepState, target: StepState
) -> None:
    if (current.value, target.value) in ALLOWED_STEP:
        check_step_transition(current, target)
    else:
        with pytest.raises(IllegalTransition):
            check_step_transition(current, target)


def test_terminal_states_have_no_way_out() -> None:
    assert SEQUENCE_TRANSITIONS[SequenceState.FINISHED] == frozenset()
    assert SEQUENCE_TRANSITIONS[SequenceState.ABORTED] == frozenset()
    for state in (StepState.RELEASED, StepState.WITHHELD, StepState.FAILED):
        assert STEP_TRANSITIONS[state] == frozenset()


def test_a_withhold_or_failure_aborts_and_only_a_release_of_the_last_step_finishes() -> None:
    assert sequence_state_after_step(StepState.WITHHELD, last=False) == SequenceState.ABORTED
    assert sequence_state_after_step(StepState.FAILED, last=True) == SequenceState.ABORTED
    assert sequence_state_after_step(StepState.RELEASED, last=False) == SequenceState.RELEASED
    assert sequence_state_after_step(StepState.RELEASED, last=True) == SequenceState.FINISHED
    assert sequence_state_after_step(StepState.REVIEW, last=True) == SequenceState.REVIEW
    with pytest.raises(IllegalTransition):
        sequence_state_after_step(StepState.RUNNING, last=False)
