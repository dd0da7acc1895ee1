"""Script steps' rows: their background run's result and its held audit record.

A script step's run is stored without changing anything its researcher can see, and its record
is appended only with a checker's first action on the step (see `safeaccess.server.steps.scripts`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from safeaccess.server.errors import NotFound
from safeaccess.server.outcome import StepOutcome
from safeaccess.server.states import StepState
from safeaccess.server.store import auditlog
from safeaccess.server.store.schema import SequenceRow, StepRow
from safeaccess.server.store.sequences import find_step, put_run_result

if TYPE_CHECKING:
    from safeaccess.server.store.database import Database


def unrun_script_steps(s: Session, kind: str) -> list[tuple[str, int, str]]:
    """(sequence id, step index, researcher) of every step of `kind` in review with neither an
    output nor an error (not run yet), in the order they were revealed."""
    rows = s.execute(
        select(StepRow.sequence_id, StepRow.index, SequenceRow.researcher)
        .join(SequenceRow, SequenceRow.id == StepRow.sequence_id)
        .where(
            StepRow.kind == kind,
            StepRow.state == StepState.REVIEW.value,
            StepRow.output.is_(None),
            StepRow.error_code.is_(None),
        )
        .order_by(StepRow.id)
    ).all()
    return [(str(seq), int(index), str(researcher)) for seq, index, researcher in rows]


def record_script_run(
    store: Database, sequence_id: str, index: int, outcome: StepOutcome, event_data: dict[str, Any]
) -> None:
    """Store a background script run's result on its step (for output checkers), leaving
    everything the researcher sees as it was: state, times, the sequence row, the rule-set
    hash fixed when the step was queued."""
    with store.transaction() as s:
        step = find_step(s, sequence_id, index, lock=True)
        if step is None:
            raise NotFound(f"step {index} of sequence {sequence_id} does not exist")
        put_run_result(step, outcome)
        # Not appended now: the log's size is in every checkpoint a researcher can fetch, so
        # an entry at the run's end would time her script on the real data. The record
        # waits for the first checker action on the step (`append_script_run`), whose time
        # is the checker's. A step decided while its script ran never gets it in the log.
        if step.state == StepState.REVIEW:
            step.run_event = event_data


def append_script_run(session: Session, step: StepRow) -> None:
    """Append a script step's held `script_run_finished` record, once, in the transaction
    of a checker's first action on the step (viewing it, approving or rejecting it)."""
    if step.run_event is None:
        return
    auditlog.append(
        session,
        "script_run_finished",
        "server",
        step.run_event,
        sequence_id=step.sequence_id,
        step_index=step.index,
    )
    step.run_event = None
