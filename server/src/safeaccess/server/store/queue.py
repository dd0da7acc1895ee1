"""The job queue's rows: procrastinate's tables in the centre's PostgreSQL database.

procrastinate (the job engine, `server/jobs/`) keeps its jobs in `procrastinate_jobs` and claims
them with `FOR UPDATE SKIP LOCKED`. A step's job is written here, through procrastinate's own
SQL function `procrastinate_defer_jobs_v1`, *inside the store's transaction that records the step
as running* — not through procrastinate's connector, which has its own connection and so could
not share that transaction. A step is therefore never running without its job, nor a job
queued for a step that was not recorded (no outbox to drain: the queue is in the same database).

A settled step is announced with `NOTIFY safeaccess_settled, '<sequence>:<index>'` in the
transaction that settles it (PostgreSQL delivers it at commit), so the API replica waiting for
the step answers at once instead of polling.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection, inspect, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

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

    @property
    def key(self) -> str:
        """The job's key: one job per step, so a re-sent reveal finds the existing one."""
        return f"step:{self.sequence_id}:{self.index}"

    def args(self) -> dict[str, object]:
        return {
            "sequence_id": self.sequence_id,
            "index": self.index,
            "researcher": self.researcher,
            "dataset": self.dataset,
        }


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


def notify_settled(session: Session, sequence_id: str, index: int) -> None:
    """Announce a settled step to the replicas waiting for it (delivered at commit)."""
    if uses_queue(session):
        session.execute(
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": SETTLED_CHANNEL, "payload": f"{sequence_id}:{index}"},
        )


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
