"""The output checkers' side: openings waiting for approval, the review queue, their decisions,
first approvals under the two-person rule, and the withhold budget's counts.

The rules (who may decide, how many checkers a dataset needs) are `safeaccess.server.review.decisions`
and `safeaccess.server.review.rules`; this module holds only their rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Select, bindparam, func, select
from sqlalchemy.orm import Session

from safeaccess.server.audit import records as audit_records
from safeaccess.server.errors import Conflict, InvalidRequest, NotFound
from safeaccess.server.states import (
    TERMINAL_SEQUENCE_STATES,
    SequenceState,
    StepState,
    check_step_transition,
    sequence_state_after_step,
)
from safeaccess.server.store import auditlog
from safeaccess.server.store.schema import (
    CheckerRow,
    DatasetRow,
    ReviewApprovalRow,
    ReviewSettingsRow,
    SequenceRow,
    StepRow,
    utcnow,
)
from safeaccess.server.store.scripts import append_script_run
from safeaccess.server.store.sequences import find_step, update_sequence

if TYPE_CHECKING:
    from safeaccess.server.store.database import Database

#: The error code recorded on step 1 of a sequence whose opening an output checker rejected.
OPENING_REJECTED = "opening_rejected"


# -- the withhold budget and openings ------------------------------------------------------------


def withholds_since(
    store: Database, researcher: str, dataset_name: str, since: datetime
) -> tuple[int, int]:
    """(steps withheld, sequences still open) for a researcher on every version of a
    dataset: withholds updated at or after `since`; rejected openings are not withholds of
    data and do not count."""
    with store.one_statement() as conn:  # one round trip for both counts
        return _counts(conn, researcher, dataset_name, since)


def _counts(
    conn: Connection, researcher: str, dataset_name: str, since: datetime
) -> tuple[int, int]:
    counts = conn.execute(
        _WITHHOLDS_SINCE,
        {"researcher": researcher, "dataset_name": dataset_name, "since": since},
    ).one()
    return int(counts[0] or 0), int(counts[1] or 0)


@dataclass
class WithholdCount:
    """A researcher's withholds on a dataset since `since` (`withholds_since`'s first count),
    counted in a step's settle transaction (`sequences.settle_step(withholds=...)`): it sees the
    step's own withhold, and the step's view shows it without a read of its own."""

    researcher: str
    dataset_name: str
    since: datetime
    #: Set by the settle.
    used: int | None = None

    def count(self, conn: Connection) -> None:
        """Count on `conn` (the settle's transaction)."""
        self.used = _counts(conn, self.researcher, self.dataset_name, self.since)[0]


#: Every sequence state but the two ends, written as IN so that the (researcher, state) index
#: finds her open sequences instead of reading all of them.
_OPEN_STATES = [s.value for s in SequenceState if s not in TERMINAL_SEQUENCE_STATES]


def _withholds_since() -> Select[Any]:
    """The statement of `withholds_since` (built once: it runs for every step's view)."""
    mine = (SequenceRow.researcher == bindparam("researcher")) & SequenceRow.dataset_id.in_(
        select(DatasetRow.id).where(DatasetRow.name == bindparam("dataset_name")).scalar_subquery()
    )
    withheld_q = (
        select(func.count())
        .select_from(StepRow)
        .join(SequenceRow, SequenceRow.id == StepRow.sequence_id)
        .where(
            mine,
            # A withhold aborts its sequence in the same transaction
            # (`states.sequence_state_after_step`): so her withholds are found through her
            # aborted sequences by the (researcher, state) index, and the time this read takes
            # depends on her own history, never on other researchers' withholds.
            SequenceRow.state == SequenceState.ABORTED.value,
            StepRow.state == StepState.WITHHELD.value,
            StepRow.updated_at >= bindparam("since", type_=StepRow.updated_at.type),
            (StepRow.error_code.is_(None)) | (StepRow.error_code != OPENING_REJECTED),
        )
        .scalar_subquery()
    )
    # Each open sequence can still end in one withhold (a withhold aborts it): opened while
    # the budget lasted, it must not be a way to collect withholds beyond it.
    open_q = (
        select(func.count())
        .select_from(SequenceRow)
        .where(
            mine,
            SequenceRow.state.in_(_OPEN_STATES),
        )
        .scalar_subquery()
    )
    return select(withheld_q, open_q)


_WITHHOLDS_SINCE = _withholds_since()


def openings_waiting(store: Database) -> list[tuple[SequenceRow, DatasetRow]]:
    """Sequences waiting for an output checker to approve their opening, oldest first."""
    with store.transaction() as s:
        query = (
            select(SequenceRow, DatasetRow)
            .join(DatasetRow, DatasetRow.id == SequenceRow.dataset_id)
            .where(SequenceRow.state == SequenceState.AWAITING_APPROVAL.value)
            .order_by(SequenceRow.created_at, SequenceRow.id)
        )
        return [(row[0], row[1]) for row in s.execute(query)]


def decide_opening(
    store: Database,
    sequence_id: str,
    *,
    approve: bool,
    reviewer: str,
    note: str,
    event_data: dict[str, Any],
) -> tuple[SequenceRow, StepRow]:
    """Approve (step 1 becomes `running`, run on the researcher's next reveal) or reject (the
    sequence is aborted) a sequence waiting past the withhold budget."""
    if not reviewer:
        raise InvalidRequest("a decision needs the output checker's name")
    with store.transaction() as s:
        seq = s.get(SequenceRow, sequence_id)
        step = find_step(s, sequence_id, 1)
        if seq is None or step is None:
            raise NotFound(f"sequence {sequence_id} does not exist")
        if seq.state != SequenceState.AWAITING_APPROVAL:
            raise Conflict(f"sequence {sequence_id} is {seq.state}, not awaiting approval")
        target = StepState.RUNNING if approve else StepState.WITHHELD
        check_step_transition(StepState(step.state), target)
        update_sequence(s, seq, SequenceState.RUNNING if approve else SequenceState.ABORTED)
        step.state = target.value
        step.reviewer = reviewer
        step.review_note = note
        if not approve:
            step.error_code = OPENING_REJECTED
        step.updated_at = utcnow()
        auditlog.append(
            s,
            "opening_approved" if approve else "opening_rejected",
            reviewer,
            event_data,
            sequence_id=sequence_id,
            step_index=1,
        )
        s.flush()
        s.refresh(seq)
        return seq, step


# -- the review queue and decisions --------------------------------------------------------------


def review_queue(store: Database) -> list[tuple[SequenceRow, StepRow]]:
    """Steps in review with their sequences, longest waiting first."""
    with store.transaction() as s:
        query = (
            select(SequenceRow, StepRow)
            .join(StepRow, StepRow.sequence_id == SequenceRow.id)
            .where(StepRow.state == StepState.REVIEW.value)
            .order_by(StepRow.updated_at)
        )
        return [(row[0], row[1]) for row in s.execute(query)]


def withheld_steps(
    store: Database, *, limit: int, offset: int = 0
) -> tuple[int, list[tuple[SequenceRow, StepRow]]]:
    """(how many steps are withheld, one page of them with their sequences, newest first): by
    the rules or by a checker, for the review workspace's "withheld" list."""
    with store.transaction() as s:
        withheld = StepRow.state == StepState.WITHHELD.value
        total = int(s.scalar(select(func.count()).select_from(StepRow).where(withheld)) or 0)
        query = (
            select(SequenceRow, StepRow)
            .join(StepRow, StepRow.sequence_id == SequenceRow.id)
            .where(withheld)
            .order_by(StepRow.updated_at.desc(), StepRow.sequence_id, StepRow.index)
            .limit(limit)
            .offset(offset)
        )
        return total, [(row[0], row[1]) for row in s.execute(query)]


def decide_review(
    store: Database,
    sequence_id: str,
    index: int,
    *,
    approve: bool,
    reviewer: str,
    note: str,
    event_data: dict[str, Any],
    public_output: dict[str, Any] | None = None,
) -> tuple[SequenceRow, StepRow]:
    """An output checker releases (approve) or withholds (reject) a step in review; with
    `public_output`, releases that (the table with the checker's mitigation applied)."""
    if not reviewer:
        raise InvalidRequest("a review decision needs the reviewer's name")
    with store.transaction() as s:
        seq = s.get(SequenceRow, sequence_id)
        step = find_step(s, sequence_id, index)
        if seq is None or step is None:
            raise NotFound(f"step {index} of sequence {sequence_id} does not exist")
        if step.state != StepState.REVIEW or seq.state != SequenceState.REVIEW:
            raise Conflict(f"step {index} of {sequence_id} is {step.state}, not in review")
        target_step = StepState.RELEASED if approve else StepState.WITHHELD
        check_step_transition(StepState(step.state), target_step)
        append_script_run(s, step)
        update_sequence(s, seq, sequence_state_after_step(target_step, last=step.last))
        step.state = target_step.value
        step.reviewer = reviewer
        step.review_note = note
        if approve and public_output is not None:
            step.public_output = public_output
        step.updated_at = utcnow()
        step.log_index = auditlog.append(
            s,
            "review_approved" if approve else "review_rejected",
            reviewer,
            {
                **event_data,
                **audit_records.outcome_data(step, step.public_output, approve),
                "state": target_step.value,
            },
            sequence_id=sequence_id,
            step_index=index,
        )
        s.flush()
        s.refresh(seq)
        return seq, step


# -- the two-person rule (the SQL of `review_rules`) ---------------------------------------------


def checkers_required(s: Session, dataset: str) -> int | None:
    """How many checkers a release on `dataset` needs, as recorded (None: never set)."""
    row = s.get(ReviewSettingsRow, dataset)
    return row.checkers if row is not None else None


def set_checkers_required(s: Session, dataset: str, checkers: int) -> None:
    """Record how many checkers a release on `dataset` needs."""
    row = s.get(ReviewSettingsRow, dataset)
    if row is None:
        s.add(ReviewSettingsRow(dataset=dataset, checkers=checkers))
    else:
        row.checkers = checkers


def linked_researcher(s: Session, checker: str) -> str | None:
    """The researcher identity a checker account is linked to (None: none, or no account)."""
    row = s.get(CheckerRow, checker)
    return row.researcher if row is not None else None


def first_approvals(s: Session, sequence_id: str, index: int) -> list[ReviewApprovalRow]:
    """The first approvals held on a step, oldest first."""
    query = (
        select(ReviewApprovalRow)
        .where(
            ReviewApprovalRow.sequence_id == sequence_id,
            ReviewApprovalRow.step_index == index,
        )
        .order_by(ReviewApprovalRow.at)
    )
    return list(s.scalars(query))


def steps_with_first_approval(s: Session) -> set[tuple[str, int]]:
    """(sequence id, step index) of every step that holds a first approval."""
    rows = s.execute(select(ReviewApprovalRow.sequence_id, ReviewApprovalRow.step_index))
    return {(r[0], r[1]) for r in rows}


def count_first_approvals(s: Session, sequence_id: str, index: int) -> int:
    """How many first approvals a step holds."""
    count = s.scalar(
        select(func.count())
        .select_from(ReviewApprovalRow)
        .where(
            ReviewApprovalRow.sequence_id == sequence_id,
            ReviewApprovalRow.step_index == index,
        )
    )
    return int(count or 0)


def add_first_approval(
    s: Session, sequence_id: str, index: int, checker: str, mitigation: dict[str, Any] | None
) -> None:
    """Keep a checker's first approval of a step (with the mitigation she applied)."""
    s.add(
        ReviewApprovalRow(
            sequence_id=sequence_id, step_index=index, checker=checker, mitigation=mitigation
        )
    )
