"""The sequence and step state machines, as explicit transition tables.

A sequence moves `opened -> running -> released | review -> ... -> finished | aborted`; each
step moves `running -> released | withheld | review | failed` and a reviewed step `review ->
released | withheld`. A sequence opened past the researcher's withhold budget waits:
`opened -> awaiting_approval -> running` (an output checker approved opening it) or `-> aborted`
(rejected), its step 1 `pending -> running` or `pending -> withheld`. Any move not in a table is a programming or concurrency error and raises
`IllegalTransition`, so the store never records an impossible history.
"""

from __future__ import annotations

from enum import StrEnum


class SequenceState(StrEnum):
    OPENED = "opened"  # header accepted; step 1 not started yet
    AWAITING_APPROVAL = "awaiting_approval"  # past the withhold budget: a checker must approve
    RUNNING = "running"  # step `current` is being computed (or must be re-run after a crash)
    RELEASED = "released"  # step `current` released; waiting for the next reveal
    REVIEW = "review"  # step `current` waits for an output checker
    FINISHED = "finished"  # the last step was released
    ABORTED = "aborted"  # a step was withheld or failed; no further reveal is accepted


class StepState(StrEnum):
    PENDING = "pending"  # step 1 of a sequence awaiting approval to open; not run
    RUNNING = "running"
    RELEASED = "released"
    WITHHELD = "withheld"
    REVIEW = "review"
    FAILED = "failed"  # the analysis itself could not run (invalid, bad filter, limits)


class IllegalTransition(Exception):
    """A state change that the state machine does not allow."""

    code = "illegal_transition"


SEQUENCE_TRANSITIONS: dict[SequenceState, frozenset[SequenceState]] = {
    SequenceState.OPENED: frozenset({SequenceState.RUNNING, SequenceState.AWAITING_APPROVAL}),
    SequenceState.AWAITING_APPROVAL: frozenset({SequenceState.RUNNING, SequenceState.ABORTED}),
    SequenceState.RUNNING: frozenset(
        {
            SequenceState.RELEASED,
            SequenceState.FINISHED,
            SequenceState.REVIEW,
            SequenceState.ABORTED,
        }
    ),
    SequenceState.RELEASED: frozenset({SequenceState.RUNNING}),
    SequenceState.REVIEW: frozenset(
        {SequenceState.RELEASED, SequenceState.FINISHED, SequenceState.ABORTED}
    ),
    SequenceState.FINISHED: frozenset(),
    SequenceState.ABORTED: frozenset(),
}

STEP_TRANSITIONS: dict[StepState, frozenset[StepState]] = {
    StepState.PENDING: frozenset({StepState.RUNNING, StepState.WITHHELD}),
    StepState.RUNNING: frozenset(
        {StepState.RELEASED, StepState.WITHHELD, StepState.REVIEW, StepState.FAILED}
    ),
    StepState.REVIEW: frozenset({StepState.RELEASED, StepState.WITHHELD}),
    StepState.RELEASED: frozenset(),
    StepState.WITHHELD: frozenset(),
    StepState.FAILED: frozenset(),
}

TERMINAL_SEQUENCE_STATES = frozenset({SequenceState.FINISHED, SequenceState.ABORTED})


def check_sequence_transition(current: SequenceState, target: SequenceState) -> None:
    """Raise IllegalTransition unless a sequence may move from `current` to `target`."""
    if target not in SEQUENCE_TRANSITIONS[current]:
        raise IllegalTransition(f"a sequence cannot move from {current} to {target}")


def check_step_transition(current: StepState, target: StepState) -> None:
    """Raise IllegalTransition unless a step may move from `current` to `target`."""
    if target not in STEP_TRANSITIONS[current]:
        raise IllegalTransition(f"a step cannot move from {current} to {target}")


def sequence_state_after_step(step: StepState, *, last: bool) -> SequenceState:
    """Where a sequence goes when its current step reaches `step`."""
    if step == StepState.RELEASED:
        return SequenceState.FINISHED if last else SequenceState.RELEASED
    if step == StepState.REVIEW:
        return SequenceState.REVIEW
    if step in (StepState.WITHHELD, StepState.FAILED):
        return SequenceState.ABORTED
    raise IllegalTransition(f"a step in state {step} does not settle its sequence")
