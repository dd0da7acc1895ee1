"""Sequences and their steps: open, reveal (`begin_step`), settle (`settle_step`), listings.

Each public function is one transaction: a step's outcome, the sequence's new state, the DP
charge or query-set pointer that goes with it and the audit-log records commit together or not
at all. Every state change goes through `states.py`'s transition tables.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import JSON, Connection, Table, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from safeaccess.server.audit import records as audit_records
from safeaccess.server.errors import Conflict, NotFound, ServiceError
from safeaccess.server.outcome import QssCommit, StepOutcome
from safeaccess.server.states import (
    SequenceState,
    StepState,
    check_sequence_transition,
    check_step_transition,
    sequence_state_after_step,
)
from safeaccess.server.store import auditlog, ledgers, queue, step_settings
from safeaccess.server.store.queue import QueuedJob
from safeaccess.server.store.schema import SequenceRow, StepRow, utcnow

if TYPE_CHECKING:
    from safeaccess.server.store.database import Database


class Counted(Protocol):
    """A count made in the settle's own transaction (`review.WithholdCount`: the review module
    sits above this one, so it is named by what settle calls)."""

    def count(self, conn: Connection) -> None: ...


def reveal_entries(
    researcher: str, data: dict[str, Any], sequence_id: str, index: int
) -> list[auditlog.Entry]:
    """A reveal and the start of its run: `data` holds the reveal's fields and, under "run",
    what the run starts with (backend, limits, runner version)."""
    reveal = {k: v for k, v in data.items() if k != "run"}
    return [
        auditlog.Entry("step_revealed", researcher, reveal, sequence_id, index),
        auditlog.Entry("run_started", "server", data.get("run", {}), sequence_id, index),
    ]


def create_sequence(
    store: Database,
    *,
    sequence_id: str,
    researcher: str,
    project: str,
    dataset_id: int,
    header: bytes,
    header_hash: str,
    nonce: str,
    signature: bytes,
    endorsements: list[Any],
    verifier_state: dict[str, Any],
    first_step: StepRow,
    event_data: dict[str, Any],
    awaiting_approval: bool = False,
    job: QueuedJob | None = None,
) -> tuple[SequenceRow, StepRow]:
    """Accept a header and start its step 1 (state `running`) in one transaction; with
    `awaiting_approval` (past the withhold budget) the sequence waits for an output checker
    and step 1 is `pending`, not run. With `job`, step 1's job is queued in the same
    transaction."""
    seq_state, step_state = (
        (SequenceState.AWAITING_APPROVAL, StepState.PENDING)
        if awaiting_approval
        else (SequenceState.RUNNING, StepState.RUNNING)
    )
    check_sequence_transition(SequenceState.OPENED, seq_state)
    now = utcnow()
    seq = SequenceRow(
        id=sequence_id,
        researcher=researcher,
        project=project,
        dataset_id=dataset_id,
        header=header,
        header_hash=header_hash,
        nonce=nonce,
        signature=signature,
        endorsements=endorsements,
        state=seq_state.value,
        current_index=1,
        verifier_state=verifier_state,
        version=1,
        created_at=now,
        updated_at=now,
    )
    first_step.sequence_id = sequence_id
    first_step.state = step_state.value
    first_step.created_at = first_step.updated_at = now
    try:
        with store.transaction() as s:
            # Core INSERTs of rows built here, as `begin_step` does: the ORM's unit of work
            # (two flushes) cost more than the two statements on every opening.
            conn = s.connection()
            conn.execute(_INSERT_SEQUENCE, {name: getattr(seq, name) for name in _SEQUENCE_KEYS})
            first_step.id = conn.execute(
                _INSERT_STEP, {name: getattr(first_step, name) for name in _INSERTED}
            ).scalar_one()
            opened = {k: v for k, v in event_data.items() if k != "reveal"}
            auditlog.append_many(
                s,
                [
                    auditlog.Entry("sequence_opened", researcher, opened, sequence_id),
                    *reveal_entries(researcher, event_data.get("reveal", {}), sequence_id, 1),
                ],
            )
            if job is not None and not awaiting_approval:
                queue.defer(s, _carrying(store, job, seq, first_step))
        if step_state == StepState.RUNNING and job is None:
            store.running.remember(seq, first_step)
        return seq, first_step
    except IntegrityError as exc:
        with store.transaction() as s:
            prior = s.scalars(
                select(SequenceRow.id).where(SequenceRow.header_hash == header_hash)
            ).first()
        where = f" (sequence {prior})" if prior else ""
        raise Conflict(
            f"this sequence header was already accepted{where}; a header is usable once — "
            "seal a new sequence",
            code="header_replayed",
        ) from exc


def get_sequence(store: Database, sequence_id: str) -> SequenceRow | None:
    """A sequence by id."""
    with store.transaction() as s:
        return s.get(SequenceRow, sequence_id)


def list_sequences(store: Database, researcher: str) -> list[SequenceRow]:
    """A researcher's sequences, oldest first."""
    with store.transaction() as s:
        query = (
            select(SequenceRow)
            .where(SequenceRow.researcher == researcher)
            .order_by(SequenceRow.created_at, SequenceRow.id)
        )
        return list(s.scalars(query))


def steps(store: Database, sequence_id: str) -> list[StepRow]:
    """A sequence's steps in order."""
    with store.transaction() as s:
        query = select(StepRow).where(StepRow.sequence_id == sequence_id).order_by(StepRow.index)
        return list(s.scalars(query))


def find_step(s: Session, sequence_id: str, index: int, *, lock: bool = False) -> StepRow | None:
    """Step `index` of a sequence in this transaction (FOR UPDATE with `lock`)."""
    query = select(StepRow).where(StepRow.sequence_id == sequence_id, StepRow.index == index)
    if lock:
        query = query.with_for_update()
    return s.scalars(query).first()


def get_step(store: Database, sequence_id: str, index: int) -> StepRow | None:
    """Step `index` of a sequence."""
    with store.transaction() as s:
        return find_step(s, sequence_id, index)


def get_sequence_step(
    store: Database, sequence_id: str, index: int
) -> tuple[SequenceRow | None, StepRow | None]:
    """A sequence and its step `index`, read in one statement: a reveal, a queued step's
    worker and the replica waiting for it each need both, on a researcher's waiting path.

    In a request's settings scope that has read nothing yet (`step_settings.py`), the same
    statement reads the settings of the sequence's dataset for the scope: the request needs
    them next, and this saves their statement.

    A Core read on an autocommit connection, the detached rows built from its labelled columns
    (`_pair_of`, as `begin_step` builds its row from its RETURNING): the ORM's loading of two
    entities cost about five times the statement (0.33 ms against 0.07 ms, measured)."""
    with_settings = step_settings.scope_is_empty(store)
    statement = _SEQUENCE_STEP_SETTINGS if with_settings else _SEQUENCE_STEP
    with store.one_statement() as conn:
        rows = conn.execute(statement, {"seq_id": sequence_id, "index": index}).all()
    if not rows:
        return None, None
    seq, step = _pair_of(rows[0])
    if with_settings:
        settings = step_settings.StepSettings.of_rows(seq.dataset_id, rows)
        if settings is not None:
            step_settings.prime(store, settings)
    return seq, step


def _pair_of(row: Any) -> tuple[SequenceRow, StepRow | None]:
    """The detached sequence and step (None: no such step) of a row (`Row`) of
    `_SEQUENCE_STEP` or `_SEQUENCE_STEP_SETTINGS`."""
    mapping = row._mapping
    if mapping[_STEP_ID] is None:
        return _sequence_of(row), None
    return _sequence_of(row), StepRow(**{key: mapping[label] for key, label in _STEP_LABELS})


def update_sequence(s: Session, seq: SequenceRow, target: SequenceState, **values: Any) -> None:
    """Move `seq` to `target` if nobody changed it since it was read (its version); Conflict
    otherwise."""
    check_sequence_transition(SequenceState(seq.state), target)
    result = s.execute(
        update(SequenceRow)
        .where(SequenceRow.id == seq.id, SequenceRow.version == seq.version)
        .values(state=target.value, version=seq.version + 1, updated_at=utcnow(), **values)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict(
            "the sequence changed while this request was handled; retry the request",
            code="concurrent_update",
        )


def begin_step(
    store: Database,
    sequence_id: str,
    *,
    expected_version: int,
    step: StepRow,
    verifier_state: dict[str, Any],
    event_data: dict[str, Any],
    job: QueuedJob | None = None,
) -> StepRow:
    """Accept reveal `step.index` of a released sequence: the step starts `running` (and,
    with `job`, its job is queued in the same transaction).

    The sequence moves with one guarded UPDATE (its id, the version the caller read, `released`
    at the step before): it both checks and changes the row, so nothing is read first; only
    when it matches no row is the row read, to say why. The row it returns, and the step, are
    kept for `settle_step` (`RunningSteps`) when this process runs the step itself.

    Why a transaction of its own, not one with the settle: the step must be recorded `running`
    before its sandbox job starts, so that a crash mid-job is seen (the step is run again on the
    repeated reveal); one transaction held open across the job would instead hold SQLite's one
    write lock (or the rows' locks) for as long as the sandbox runs."""
    # The only move this function makes; the UPDATE below matches `released` rows only.
    check_sequence_transition(SequenceState.RELEASED, SequenceState.RUNNING)
    now = utcnow()
    with store.transaction() as s:
        conn = s.connection()
        moved = conn.execute(
            _BEGIN,
            {
                "seq_id": sequence_id,
                "expected": expected_version,
                "released": SequenceState.RELEASED.value,
                "previous": step.index - 1,
                "running": SequenceState.RUNNING.value,
                "new_index": step.index,
                "new_verifier_state": verifier_state,
                "now": now,
            },
        ).first()
        if moved is None:
            raise _refusal(s, sequence_id, expected_version, step.index)
        researcher = moved.seq_researcher
        step.sequence_id = sequence_id
        step.state = StepState.RUNNING.value
        step.created_at = step.updated_at = now
        # A Core INSERT: the ORM's unit of work for one new row costs more than the statement.
        step.id = conn.execute(
            _INSERT_STEP, {name: getattr(step, name) for name in _INSERTED}
        ).scalar_one()
        auditlog.append_many(s, reveal_entries(researcher, event_data, sequence_id, step.index))
        if job is not None:
            # The job carries the rows as this transaction writes them (the sequence at the
            # version the settle is guarded by) and the settings the request read: its first
            # run reads nothing (`queue.Carried`).
            queue.defer(s, _carrying(store, job, _sequence_of(moved), step))
    if job is None:
        # Settled by this process (not by a worker host): `settle_step` need not read them.
        store.running.remember(_sequence_of(moved), step)
    return step


def _carrying(store: Database, job: QueuedJob, seq: SequenceRow, step: StepRow) -> QueuedJob:
    """`job` carrying `seq` and `step` and the settings the open scope read for the sequence's
    dataset (none if it read none: the worker reads them)."""
    return job.carrying(seq, step, step_settings.scoped_by_id(store, seq.dataset_id))


def _sequence_of(row: Any) -> SequenceRow:
    """A detached sequence row from a Core row (`Row`) holding every `sequences` column under
    its `_SEQUENCE_LABELS` label (`_BEGIN`'s RETURNING, `_SEQUENCE_STEP`)."""
    mapping = row._mapping
    return SequenceRow(**{key: mapping[label] for key, label in _SEQUENCE_LABELS})


_SEQUENCES: Table = SequenceRow.__table__  # type: ignore[assignment]
_STEPS: Table = StepRow.__table__  # type: ignore[assignment]
# The two tables' columns under labels of their own: they share names (id, state, version),
# and so do the settings' `COLUMNS` (version, name), which `StepSettings.of_rows` reads by name.
_SEQUENCE_LABELS = [(c.key, f"seq_{c.key}") for c in _SEQUENCES.c]
_STEP_LABELS = [(c.key, f"step_{c.key}") for c in _STEPS.c]
_STEP_ID = "step_id"
_SEQUENCE_LABELLED = [_SEQUENCES.c[key].label(label) for key, label in _SEQUENCE_LABELS]
_PAIR = (*_SEQUENCE_LABELLED, *(_STEPS.c[key].label(label) for key, label in _STEP_LABELS))
_SEQUENCE_STEP_FROM = _SEQUENCES.outerjoin(
    _STEPS, (_STEPS.c.sequence_id == _SEQUENCES.c.id) & (_STEPS.c.index == bindparam("index"))
)
_SEQUENCE_STEP = (
    select(*_PAIR).select_from(_SEQUENCE_STEP_FROM).where(_SEQUENCES.c.id == bindparam("seq_id"))
)
# One row per row of the settings' statement (the sequence and step repeat on each).
_SEQUENCE_STEP_SETTINGS = (
    select(*_PAIR, *step_settings.COLUMNS)
    .select_from(step_settings.joined(_SEQUENCE_STEP_FROM, _SEQUENCES.c.dataset_id))
    .where(_SEQUENCES.c.id == bindparam("seq_id"))
)
# Built once: statement construction costs more than executing them on the step's path.
_BEGIN = (
    update(_SEQUENCES)
    .where(
        _SEQUENCES.c.id == bindparam("seq_id"),
        _SEQUENCES.c.version == bindparam("expected"),
        _SEQUENCES.c.state == bindparam("released"),
        _SEQUENCES.c.current_index == bindparam("previous"),
    )
    .values(
        state=bindparam("running"),
        current_index=bindparam("new_index"),
        verifier_state=bindparam("new_verifier_state", type_=_SEQUENCES.c.verifier_state.type),
        version=_SEQUENCES.c.version + 1,
        updated_at=bindparam("now", type_=_SEQUENCES.c.updated_at.type),
    )
    .returning(*_SEQUENCE_LABELLED)
)
_MOVE = (
    update(_SEQUENCES)
    .where(_SEQUENCES.c.id == bindparam("seq_id"), _SEQUENCES.c.version == bindparam("expected"))
    .values(
        state=bindparam("target"),
        version=bindparam("expected") + 1,
        updated_at=bindparam("now", type_=_SEQUENCES.c.updated_at.type),
    )
)
#: The columns `settle_step` writes on the step row.
_SETTLED = (
    "state",
    "kind",
    "output",
    "public_output",
    "output_hash",
    "decision",
    "ruleset_hash",
    "error_code",
    "error_message",
    "backend",
    "wall_seconds",
    "output_salt",
    "log_index",
    "updated_at",
)


#: A step's columns that hold its run's result: the `StepOutcome` fields of the same names.
RUN_RESULT = (
    "output",
    "public_output",
    "output_hash",
    "decision",
    "error_code",
    "error_message",
    "backend",
    "wall_seconds",
)


def put_run_result(step: StepRow, outcome: StepOutcome) -> None:
    """Copy the run's result (`RUN_RESULT`) from `outcome` onto the step's row: a settled
    step's and a background script run's (`scripts.record_script_run`) alike."""
    for name in RUN_RESULT:
        setattr(step, name, getattr(outcome, name))


def _bind_type(name: str) -> Any:
    """The column's type for a bound value; a JSON column's None is SQL NULL, as the ORM wrote
    it (JSON's default writes the JSON text 'null', which `IS NULL` does not match)."""
    column_type = _STEPS.c[name].type
    return JSON(none_as_null=True) if isinstance(column_type, JSON) else column_type


_SETTLE = (
    update(_STEPS)
    .where(_STEPS.c.id == bindparam("step_id"))
    .values({name: bindparam(f"new_{name}", type_=_bind_type(name)) for name in _SETTLED})
)
#: The columns `begin_step` and `create_sequence` write on a new step row (all but its id).
_INSERTED = tuple(column.key for column in _STEPS.c if column.key != "id")
_INSERT_STEP = (
    insert(_STEPS)
    .values({name: bindparam(name, type_=_bind_type(name)) for name in _INSERTED})
    .returning(_STEPS.c.id)
)
_SEQUENCE_KEYS = tuple(column.key for column in _SEQUENCES.c)
_INSERT_SEQUENCE = insert(_SEQUENCES).values(
    {name: bindparam(name, type_=_SEQUENCES.c[name].type) for name in _SEQUENCE_KEYS}
)


def _refusal(s: Session, sequence_id: str, expected_version: int, index: int) -> ServiceError:
    """Why `begin_step`'s guarded UPDATE matched no row."""
    seq = s.get(SequenceRow, sequence_id)
    if seq is None:
        return NotFound(f"sequence {sequence_id} does not exist")
    if seq.version != expected_version:
        return Conflict(
            "the sequence changed while this request was handled; retry the request",
            code="concurrent_update",
        )
    return Conflict(
        f"step {index} cannot be revealed while the sequence is {seq.state} at "
        f"step {seq.current_index}",
        code="not_released",
    )


def settle_step(
    store: Database,
    sequence_id: str,
    index: int,
    outcome: StepOutcome,
    event_data: dict[str, Any],
    *,
    qss: QssCommit | None = None,
    job: QueuedJob | None = None,
    withholds: Counted | None = None,
) -> tuple[SequenceRow, StepRow]:
    """Record a computed step's outcome and move the sequence on, in one transaction; with
    `qss`, point the scope at the auditor state that admitted this step in the same one; with
    `job` (a script answered "in review"), queue the job that runs it in the same one too; with
    `withholds`, count them in the same one (for the step's view)."""
    try:
        return _settle_step(store, sequence_id, index, outcome, event_data, qss, job, withholds)
    except IntegrityError as exc:
        # Two replicas created the scope's first pointer at once: the later one re-admits.
        raise Conflict(
            "the query-set audit state changed while this step was checked",
            code="qss_state_changed",
        ) from exc


def _settle_step(
    store: Database,
    sequence_id: str,
    index: int,
    outcome: StepOutcome,
    event_data: dict[str, Any],
    qss: QssCommit | None,
    job: QueuedJob | None = None,
    withholds: Counted | None = None,
) -> tuple[SequenceRow, StepRow]:
    """Record a computed step's outcome and move the sequence on, in one transaction (with
    the DP ledger's charge when the step releases a DP answer: no answer without its charge,
    no charge without its answer).

    The two rows are those `begin_step` (or `create_sequence`) kept when this process started
    the step, else read once and detached: their changes are written by one Core UPDATE each
    (the ORM's unit of work and the re-read after it cost more than the SQL), and the returned
    rows carry exactly the values written."""
    kept = store.running.take(sequence_id, index)
    with store.transaction() as s:
        if outcome.dp_charge is not None:
            ledgers.charge(s, outcome.dp_charge)
        conn = s.connection()
        now = utcnow()
        moved = None
        if kept is not None:
            # Started `running` by this process: its guarded UPDATE proves the sequence is still
            # at the version begin_step left (so still running this step), with no read first.
            moved = _move_kept(conn, kept, outcome, now)
        if moved is None:
            moved = _move_read(s, sequence_id, index, outcome, now)
        seq, step, target = moved
        if qss is not None:
            ledgers.move_qss_pointer(s, qss)
        seq.state, seq.version, seq.updated_at = target.value, seq.version + 1, now
        step.state = outcome.state.value
        step.kind = outcome.kind
        step.ruleset_hash = outcome.ruleset_hash
        put_run_result(step, outcome)
        step.updated_at = now
        ruleset = _settle_events(store, s, step, outcome, event_data, sequence_id, index)
        conn.execute(
            _SETTLE,
            {"step_id": step.id, **{f"new_{name}": getattr(step, name) for name in _SETTLED}},
        )
        if job is not None:
            queue.defer(s, job)
        if withholds is not None:
            withholds.count(conn)
        queue.notify_settled(s, sequence_id, index, settled=(seq, step))
    if ruleset is not None:
        store.logged_rulesets.add(ruleset)  # committed now: the next step need not look it up
    return seq, step


def _move_kept(
    conn: Connection, kept: tuple[SequenceRow, StepRow], outcome: StepOutcome, now: datetime
) -> tuple[SequenceRow, StepRow, SequenceState] | None:
    """Move the sequence kept by `begin_step` on, guarded by its version; None if the row
    changed since (the caller reads it and says why)."""
    seq, step = kept
    check_step_transition(StepState(step.state), outcome.state)
    target = sequence_state_after_step(outcome.state, last=step.last)
    check_sequence_transition(SequenceState(seq.state), target)
    moved = conn.execute(
        _MOVE, {"seq_id": seq.id, "expected": seq.version, "target": target.value, "now": now}
    )
    if moved.rowcount != 1:
        return None
    return seq, step, target


def _move_read(
    s: Session, sequence_id: str, index: int, outcome: StepOutcome, now: datetime
) -> tuple[SequenceRow, StepRow, SequenceState]:
    """Read the sequence and (locked) step, check the move, and move the sequence on."""
    seq = s.get(SequenceRow, sequence_id)
    step = find_step(s, sequence_id, index, lock=True)
    if seq is None or step is None:
        raise NotFound(f"step {index} of sequence {sequence_id} does not exist")
    if seq.current_index != index or seq.state != SequenceState.RUNNING:
        raise Conflict(
            f"step {index} is no longer running (sequence is {seq.state})",
            code="concurrent_update",
        )
    check_step_transition(StepState(step.state), outcome.state)
    target = sequence_state_after_step(outcome.state, last=step.last)
    check_sequence_transition(SequenceState(seq.state), target)
    s.expunge(seq)
    s.expunge(step)
    moved = s.connection().execute(
        _MOVE, {"seq_id": seq.id, "expected": seq.version, "target": target.value, "now": now}
    )
    if moved.rowcount != 1:
        raise Conflict(
            "the sequence changed while this request was handled; retry the request",
            code="concurrent_update",
        )
    return seq, step, target


def _settle_events(
    store: Database,
    s: Session,
    step: StepRow,
    outcome: StepOutcome,
    event_data: dict[str, Any],
    sequence_id: str,
    index: int,
) -> str | None:
    """The run's end, the checks with the facts they used (and the rule set, the first time
    it decides anything), and the outcome with a salted commitment to the output; the rule
    set's hash when its record was appended here."""
    records = audit_records.settle_records(step, outcome, event_data)
    entries = []
    ruleset = records.ruleset
    appended = None
    if ruleset is not None and not _ruleset_logged(store, s, ruleset["sha256"]):
        entries.append(auditlog.Entry("ruleset", "server", ruleset, subject=ruleset["sha256"]))
        appended = str(ruleset["sha256"])
    entries += [
        auditlog.Entry("run_finished", "server", records.run, sequence_id, index),
        auditlog.Entry("checks", "server", records.checks, sequence_id, index),
        # The outcome record is the one a researcher fetches to check her receipt: its time is
        # her reveal's, since the moment a run ends tells how long it ran, which depends on the
        # data. The run's own records (auditors only) keep the moment they were written.
        auditlog.Entry(
            f"step_{outcome.state.value}",
            "server",
            records.outcome,
            sequence_id,
            index,
            time=step.created_at,
        ),
    ]
    step.log_index = auditlog.append_many(s, entries)[-1]
    return appended


def _ruleset_logged(store: Database, s: Session, digest: str) -> bool:
    # Only a committed fact is cached (the log is append-only), never an absence.
    if digest in store.logged_rulesets:
        return True
    if auditlog.logged(s, "ruleset", digest):
        store.logged_rulesets.add(digest)
        return True
    return False
