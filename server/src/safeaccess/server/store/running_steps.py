"""The steps recorded `running` in sequences that are running: each is being computed by a live
server, or was left by one that died mid-step (`steps/orphans.py` tells which)."""

from __future__ import annotations

from sqlalchemy import and_, select

from safeaccess.server.states import SequenceState, StepState
from safeaccess.server.store.database import Database
from safeaccess.server.store.schema import SequenceRow, StepRow


def running_steps(store: Database) -> list[tuple[str, int]]:
    """(sequence id, step index) of every step running as its sequence's current step."""
    query = (
        select(SequenceRow.id, StepRow.index)
        .join(
            StepRow,
            and_(
                StepRow.sequence_id == SequenceRow.id,
                StepRow.index == SequenceRow.current_index,
            ),
        )
        # The index on sequences.state (migration 0006) keeps this a lookup of the few running
        # sequences, however many a centre has recorded.
        .where(SequenceRow.state == SequenceState.RUNNING.value)
        .where(StepRow.state == StepState.RUNNING.value)
    )
    with store.one_statement() as conn:
        return [(row[0], int(row[1])) for row in conn.execute(query)]
