"""The job queue's rows: procrastinate's tables in the centre's PostgreSQL database.

procrastinate (the job engine, `server/jobs/`) keeps its jobs in `procrastinate_jobs` and claims
them with `FOR UPDATE SKIP LOCKED`. A step's job is written here, through procrastinate's own
SQL function `procrastinate_defer_jobs_v1`, *inside the store's transaction that records the step
as running* — not through procrastinate's connector, which has its own connection and so could
not share that transaction. A step is therefore never running without its job, nor a job
queued for a step that was not recorded (no outbox to drain: the queue is in the same database).
The job carries the rows that transaction writes (`Carried`), so a worker's first run of it
computes without reading the step first.

A settled step is announced with `NOTIFY safeaccess_settled, '<sequence>:<index> <fields>'` in
the transaction that settles it (PostgreSQL delivers it at commit), so the API replica waiting
for the step answers at once instead of polling, and from the fields the settle wrote (what the
step's view reads) instead of reading the rows again; fields too large for a NOTIFY are left
out, and the replica reads the rows.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from datetime import datetime
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Connection, Table, inspect, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from safeaccess.server.config import ServerConfig
from safeaccess.server.store import step_settings
from safeaccess.server.store.schema import SequenceRow, StepRow

#: The task that computes an interactive step, and the one that runs a script.
TABLE_TASK = "safeaccess.run_step"
SCRIPT_TASK = "safeaccess.run_script"
#: Interactive steps (any kind but scripts): the researcher waits for them.
STEPS = "steps"
#: Scripts: run in the background, with their own slots, so they never delay a table.
SCRIPTS = "scripts"
#: The channel a settled step is announced on.
SETTLED_CHANNEL = "safeaccess_settled"
#: procrastinate's tables (and ours never start so): migrations and schema checks skip them.
PREFIX = "procrastinate_"


class QueuedJob(BaseModel):
    """One step's job as the queue holds it."""

    model_config = ConfigDict(frozen=True)

    task: str
    queue: str
    sequence_id: str
    index: int = Field(ge=1)
    researcher: str
    #: The step's dataset: a worker prefers the datasets it holds warm (`store/affinity.py`).
    dataset: str = ""
    #: The researcher's lanes (procrastinate locks): at most this many of her jobs run at once.
    lanes: int = Field(ge=1)
    #: What the worker's first run would read (`Carried`), or None: the worker reads it.
    carried: dict[str, Any] | None = None

    def carrying(
        self, seq: SequenceRow, step: StepRow, settings: step_settings.StepSettings | None
    ) -> QueuedJob:
        """This job carrying the rows as the transaction queuing it writes them (`Carried`)."""
        return self.model_copy(
            update={"carried": Carried.of(seq, step, settings).model_dump(mode="json")}
        )

    @property
    def key(self) -> str:
        """The job's key: one job per step, so a re-sent reveal finds the existing one."""
        return f"step:{self.sequence_id}:{self.index}"

    def args(self) -> dict[str, object]:
        """The task's keyword arguments (`jobs/tasks.py`)."""
        args: dict[str, object] = {
            "sequence_id": self.sequence_id,
            "index": self.index,
            "researcher": self.researcher,
            "dataset": self.dataset,
        }
        if self.carried is not None:
            args["carried"] = self.carried
        return args


def steps_queue(config: ServerConfig, dataset: str) -> str:
    """The queue of a dataset's interactive steps: its pool's, else 'steps'."""
    pool = config.queue.pools.get(dataset)
    return f"{STEPS}.{pool}" if pool else STEPS


def step_job(
    config: ServerConfig,
    *,
    sequence_id: str,
    index: int,
    researcher: str,
    dataset: str,
    script: bool,
) -> QueuedJob:
    """The job that computes step `index` of a sequence (the queue's vocabulary is the store's,
    so the steps below the job layer describe their jobs without importing it)."""
    return QueuedJob(
        task=SCRIPT_TASK if script else TABLE_TASK,
        queue=SCRIPTS if script else steps_queue(config, dataset),
        sequence_id=sequence_id,
        index=index,
        researcher=researcher,
        dataset=dataset,
        lanes=config.max_jobs_per_researcher,
    )


class Carried(BaseModel):
    """What a worker's run of a step reads before it computes, carried by the step's job: the
    sequence row as the transaction that queued the job left it (its version guards the
    settle), the running step, and its dataset's settings as the reveal read them.

    So a job's first run computes without reading anything. Only the columns the computation
    and its settle use are carried (not the header, signature, endorsements or verifier state):
    the rows rebuilt from them are transient and never shown. Safe however late the job runs:
    the settle is guarded by the sequence's version, so a run from stale rows (the step settled
    meanwhile) records nothing (`Conflict`); a run after the first reads the rows anyway."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sequence_id: str
    researcher: str
    project: str
    dataset_id: int
    sequence_state: str
    current_index: int
    version: int
    sequence_created_at: datetime
    sequence_updated_at: datetime
    step_id: int
    index: int
    trace_hash: str
    #: The step's body, base64 (a table's body is a small JSON analysis).
    body: str
    body_hash: str
    last: bool
    state: str
    created_at: datetime
    updated_at: datetime
    #: `step_settings.StepSettings.to_args`, or None (the worker reads them).
    settings: dict[str, Any] | None = None

    @classmethod
    def of(
        cls, seq: SequenceRow, step: StepRow, settings: step_settings.StepSettings | None
    ) -> Carried:
        """The fields of the rows just written (and of the settings the request read)."""
        return cls(
            **{field: getattr(seq, column) for field, column in _SEQUENCE_COLUMNS.items()},
            **{field: getattr(step, column) for field, column in _STEP_COLUMNS.items()},
            body=base64.b64encode(step.body).decode("ascii"),
            settings=None if settings is None else settings.to_args(),
        )

    def rows(self) -> tuple[SequenceRow, StepRow]:
        """New transient rows with the carried fields (the others left unset)."""
        seq = SequenceRow(
            **{column: getattr(self, field) for field, column in _SEQUENCE_COLUMNS.items()}
        )
        step = StepRow(
            **{column: getattr(self, field) for field, column in _STEP_COLUMNS.items()},
            sequence_id=self.sequence_id,
            body=base64.b64decode(self.body, validate=True),
        )
        return seq, step


def _same(*names: str) -> dict[str, str]:
    return {name: name for name in names}


#: A carried field -> its column in the sequence row, and in the step row (the body apart: it
#: travels in base64). One map serves both directions (`Carried.of` and `Carried.rows`).
_SEQUENCE_COLUMNS = {
    "sequence_id": "id",
    "sequence_state": "state",
    "sequence_created_at": "created_at",
    "sequence_updated_at": "updated_at",
} | _same("researcher", "project", "dataset_id", "current_index", "version")
_STEP_COLUMNS = {"step_id": "id"} | _same(
    "index", "trace_hash", "body_hash", "last", "state", "created_at", "updated_at"
)


def carried_rows(
    carried: Mapping[str, Any] | None, sequence_id: str, index: int
) -> tuple[SequenceRow, StepRow, step_settings.StepSettings | None] | None:
    """The rows (and settings) a job carries for step `index` of `sequence_id`, or None when it
    carries none, or fields of another release or of another step: the worker reads them."""
    if not carried:
        return None
    try:
        fields = Carried.model_validate(carried)
        seq, step = fields.rows()
        settings = (
            None
            if fields.settings is None
            else step_settings.StepSettings.from_args(fields.settings)
        )
    except (ValidationError, ValueError, TypeError, KeyError, binascii.Error):
        return None
    if seq.id != sequence_id or step.index != index:
        return None
    if settings is not None and settings.dataset_id != seq.dataset_id:
        settings = None
    return seq, step, settings


def uses_queue(session: Session) -> bool:
    """Whether this database can hold the queue (PostgreSQL only)."""
    return session.get_bind().dialect.name == "postgresql"


def defer(session: Session, job: QueuedJob) -> int:
    """Queue `job` in the caller's transaction; returns its id. Fair across researchers: a job's
    priority is minus the researcher's jobs already waiting or running in its queue (the queue
    takes the highest first, so whoever has fewest goes first), and its lock is one of her
    `lanes` (procrastinate runs one job per lock at a time: at most `lanes` of hers at once)."""
    # One statement (counting her pending jobs, choosing the lane, deferring): this runs in the
    # step's transaction, on the latency a researcher waits for. Lanes per queue: her scripts
    # waiting never hold up her tables (their run time is not hers to observe, and her answers
    # must not wait for them).
    return int(
        session.execute(
            text(
                "WITH pending AS (SELECT count(*)::int AS n FROM procrastinate_jobs "
                "WHERE queue_name = :queue AND status IN ('todo', 'doing') "
                "AND args->>'researcher' = :researcher) "
                "SELECT unnest(procrastinate_defer_jobs_v1(ARRAY[ROW(:queue, :task, -pending.n, "
                ":lane || (pending.n % :lanes)::text, :key, CAST(:args AS jsonb), NULL)]"
                "::procrastinate_job_to_defer_v1[])) FROM pending"
            ),
            {
                "queue": job.queue,
                "researcher": job.researcher,
                "task": job.task,
                "lane": f"lane:{job.queue}:{job.researcher}:",
                "lanes": job.lanes,
                "key": job.key,
                "args": json.dumps(job.args()),
            },
        ).scalar_one()
    )


def ensure(session: Session, job: QueuedJob) -> bool:
    """Queue `job` unless a job with its key is waiting or running; True if queued now. Two
    replicas doing this at once queue one job (the queue's unique index on waiting keys)."""
    if job_status(session, job.key) in ("todo", "doing"):
        return False
    try:
        with session.begin_nested():
            defer(session, job)
    except IntegrityError:
        return False
    return True


def job_status(session: Session, key: str) -> str | None:
    """The status of the newest job with this key (todo, doing, succeeded, failed, ...)."""
    return session.execute(
        text(
            "SELECT status::text FROM procrastinate_jobs WHERE queueing_lock = :key "
            "ORDER BY id DESC LIMIT 1"
        ),
        {"key": key},
    ).scalar_one_or_none()


def notify_settled(
    session: Session,
    sequence_id: str,
    index: int,
    *,
    settled: tuple[SequenceRow, StepRow] | None = None,
) -> None:
    """Announce a settled step to the replicas waiting for it (delivered at commit). With
    `settled` (the rows as this transaction writes them), the announcement carries the view's
    fields when they fit (`announcement`), so the waiting replica answers without a read."""
    if uses_queue(session):
        session.execute(
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": SETTLED_CHANNEL, "payload": announcement(sequence_id, index, settled)},
        )


#: PostgreSQL refuses a NOTIFY payload of this many bytes or more (its NOTIFY_PAYLOAD_MAX_LENGTH).
NOTIFY_LIMIT = 8000


class SettledFields(BaseModel):
    """What a step's view reads of the rows its settle writes, as the NOTIFY carries it.

    Only columns of the step's own rows, and only those `Views.step` (and the receipt) read:
    not the full output with its facts, nor the run's backend or wall time. The payload reaches
    only the centre's own database sessions that LISTEN, the same trust as the rows."""

    # NaN and infinities stay floats when dumped, so that `announcement` refuses them rather
    # than carrying null for them (pydantic's default).
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        ser_json_bytes="hex",
        val_json_bytes="hex",
        ser_json_inf_nan="constants",
    )

    sequence_state: str
    sequence_index: int
    sequence_version: int
    sequence_updated_at: datetime
    state: str
    kind: str | None
    public_output: dict[str, Any] | None
    decision: dict[str, Any] | None
    ruleset_hash: str | None
    error_code: str | None
    error_message: str | None
    output_salt: bytes | None
    log_index: int | None
    reviewer: str | None
    review_note: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, seq: SequenceRow, step: StepRow) -> SettledFields:
        """The fields of the rows a settle wrote."""
        return cls(
            sequence_state=seq.state,
            sequence_index=seq.current_index,
            sequence_version=seq.version,
            sequence_updated_at=seq.updated_at,
            **{name: getattr(step, name) for name in _STEP_FIELDS},
        )

    def rows(self, seq: SequenceRow, step: StepRow) -> tuple[SequenceRow, StepRow]:
        """New detached rows: `seq` and `step` (as the waiter holds them, running) with what the
        settle wrote. For the step's view only: the columns left out above keep their running
        values (a read gives them, when anything but a view needs them)."""
        latest = SequenceRow(**{c.key: getattr(seq, c.key) for c in _SEQUENCES.c})
        latest.state, latest.current_index = self.sequence_state, self.sequence_index
        latest.version, latest.updated_at = self.sequence_version, self.sequence_updated_at
        row = StepRow(**{c.key: getattr(step, c.key) for c in _STEPS.c})
        for name in _STEP_FIELDS:
            setattr(row, name, getattr(self, name))
        return latest, row


_SEQUENCES: Table = SequenceRow.__table__  # type: ignore[assignment]
_STEPS: Table = StepRow.__table__  # type: ignore[assignment]
#: The step's columns that `SettledFields` carries.
_STEP_FIELDS = tuple(
    name for name in SettledFields.model_fields if not name.startswith("sequence_")
)


def announcement(sequence_id: str, index: int, settled: tuple[SequenceRow, StepRow] | None) -> str:
    """The NOTIFY payload: `<sequence>:<index>`, then a space and the view's fields as JSON
    when there are rows and they fit PostgreSQL's limit; the key alone tells the waiter to read
    the row (a large output, or no rows given)."""
    key = f"{sequence_id}:{index}"
    if settled is None:
        return key
    try:
        # ASCII only (non-ASCII escaped): the limit counts bytes in the database's encoding.
        fields = json.dumps(
            SettledFields.of(*settled).model_dump(mode="json"),
            separators=(",", ":"),
            ensure_ascii=True,
            allow_nan=False,
        )
    except (ValueError, TypeError):
        # A value JSON cannot carry exactly: the waiter reads the row. Carrying the view only
        # saves a read, so it never fails the settle it is part of.
        return key
    payload = f"{key} {fields}"
    return payload if len(payload) < NOTIFY_LIMIT else key


def parse_announcement(payload: str) -> tuple[str, str | None]:
    """(the step's key, the view's fields as JSON or None: read the row) of a NOTIFY payload."""
    key, _, fields = payload.partition(" ")
    return key, fields or None


def settled_rows(
    fields: str, seq: SequenceRow, step: StepRow
) -> tuple[SequenceRow, StepRow] | None:
    """The rows of the announced settle for a step's view (`SettledFields.rows`), or None if the
    fields do not parse (a payload of another release: the caller reads the row instead)."""
    try:
        return SettledFields.model_validate_json(fields).rows(seq, step)
    except ValidationError:
        return None


def install_schema(connection: Connection) -> bool:
    """Create procrastinate's tables and functions (PostgreSQL; once). True if created."""
    if connection.dialect.name != "postgresql":
        return False
    if "procrastinate_jobs" in inspect(connection).get_table_names():
        return False
    run_script(connection, resources.files("procrastinate.sql").joinpath("schema.sql").read_text())
    return True


def run_script(connection: Connection, script: str) -> None:
    """Run SQL statements with dollar-quoted bodies (and '%' in them) in the caller's
    transaction: straight to the driver's cursor, without parameters, so nothing is read as a
    placeholder."""
    cursor = connection.connection.cursor()
    try:
        cursor.execute(script)
    finally:
        cursor.close()


def uninstall_schema(connection: Connection) -> bool:
    """Drop procrastinate's tables, functions and types (PostgreSQL); True if there were any.
    Found by their prefix in the catalogue rather than listed, so a later procrastinate release's
    objects go too. Its jobs, waiting or done, go with them: run it with no worker running."""
    if connection.dialect.name != "postgresql":
        return False
    like = {"p": PREFIX.replace("_", r"\_") + "%"}
    tables = (
        connection.execute(
            text(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE :p"
            ),
            like,
        )
        .scalars()
        .all()
    )
    functions = (
        connection.execute(
            text(
                "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n "
                "ON n.oid = p.pronamespace WHERE n.nspname = current_schema() AND p.proname LIKE :p"
            ),
            like,
        )
        .scalars()
        .all()
    )
    types = (
        connection.execute(
            text(
                "SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
                "WHERE n.nspname = current_schema() AND t.typname LIKE :p AND t.typtype IN ('e', 'c') "
                "AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.reltype = t.oid AND c.relkind <> 'c')"
            ),
            like,
        )
        .scalars()
        .all()
    )
    # Names come from the catalogue, quoted by PostgreSQL's own rules (regprocedure, quote_ident).
    for table in tables:
        connection.exec_driver_sql(f'DROP TABLE IF EXISTS "{table}" CASCADE')
    for function in functions:
        connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {function} CASCADE")
    for type_name in types:
        connection.exec_driver_sql(f'DROP TYPE IF EXISTS "{type_name}" CASCADE')
    return bool(tables or functions or types)


def include_name(name: str | None, type_: str, parent_names: Mapping[Any, str | None]) -> bool:
    """Alembic's filter: the queue's tables (and their indexes) are procrastinate's, not the
    models'."""
    table = name if type_ == "table" else parent_names.get("table_name")
    return not (table or "").startswith(PREFIX)
