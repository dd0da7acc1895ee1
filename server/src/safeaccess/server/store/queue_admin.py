"""The job queue as an operator sees it: procrastinate's tables read and moved in SQL
(`safeaccess-server queue ...`, the metrics' `QueueCollector`, the readiness check).

Only the jobs' rows are touched here. What a job's step becomes when the operator gives up on
it (`queue fail`) is recorded by the flow (`Flow.record_lost`), exactly as for a job whose
workers all died.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from safeaccess.server.errors import ConfigError, NotFound

if TYPE_CHECKING:
    from safeaccess.server.store.database import Database

#: The states a job can be in (procrastinate's `procrastinate_job_status`).
STATES = ("todo", "doing", "succeeded", "failed", "cancelled", "aborted")


@dataclass(frozen=True)
class JobRow:
    """One job of the queue, as the operator's commands show it."""

    id: int
    queue: str
    task: str
    status: str
    attempts: int
    sequence_id: str
    index: int
    worker: str | None
    scheduled_at: datetime | None
    #: The last event procrastinate recorded for the job, and when.
    last_event: str | None
    last_event_at: datetime | None


def _require_queue(store: Database) -> None:
    if store.engine.dialect.name != "postgresql":
        raise ConfigError(
            "this centre has no job queue: it runs on SQLite (the queue needs PostgreSQL and "
            "execution: queue)"
        )


def _read(store: Database, statement: str) -> Sequence[Any]:
    """The rows of one read of procrastinate's tables (refused without a job queue)."""
    _require_queue(store)
    with store.engine.connect() as connection:
        return connection.execute(text(statement)).all()


def job_counts(store: Database) -> dict[tuple[str, str], int]:
    """How many jobs each queue holds in each state (todo is its depth)."""
    rows = _read(
        store,
        "SELECT queue_name, status::text, count(*) FROM procrastinate_jobs "
        "GROUP BY queue_name, status",
    )
    return {(str(q), str(s)): int(n) for q, s, n in rows}


def worker_heartbeats(store: Database) -> list[tuple[str, float]]:
    """Each registered procrastinate worker (one per claim loop of a `worker` host: its id and
    the names of the jobs it holds are in `queue status`) and the seconds since its last
    heartbeat, newest first."""
    rows = _read(
        store,
        "SELECT id, EXTRACT(EPOCH FROM (now() - last_heartbeat)) "
        "FROM procrastinate_workers ORDER BY last_heartbeat DESC",
    )
    return [(str(i), float(age)) for i, age in rows]


def newest_heartbeat_age(store: Database) -> float | None:
    """Seconds since any worker's last heartbeat; None if no worker is registered."""
    beats = worker_heartbeats(store)
    return min(age for _worker, age in beats) if beats else None


_JOB_COLUMNS = """
    j.id, j.queue_name, j.task_name, j.status::text, j.attempts, j.args, j.worker_id::text,
    j.scheduled_at,
    (SELECT e.type::text FROM procrastinate_events e WHERE e.job_id = j.id
     ORDER BY e.at DESC, e.id DESC LIMIT 1),
    (SELECT max(e.at) FROM procrastinate_events e WHERE e.job_id = j.id)
"""


def _job(row: Any) -> JobRow:
    args = row[5] or {}
    return JobRow(
        id=int(row[0]),
        queue=str(row[1]),
        task=str(row[2]),
        status=str(row[3]),
        attempts=int(row[4]),
        sequence_id=str(args.get("sequence_id", "")),
        index=int(args.get("index", 0)),
        worker=row[6],
        scheduled_at=row[7],
        last_event=row[8],
        last_event_at=row[9],
    )


def jobs(store: Database, states: tuple[str, ...], limit: int = 100) -> list[JobRow]:
    """The newest `limit` jobs in `states`."""
    _require_queue(store)
    with store.engine.connect() as connection:
        rows = connection.execute(
            text(
                f"SELECT {_JOB_COLUMNS} FROM procrastinate_jobs j "  # noqa: S608 (constants)
                "WHERE j.status::text = ANY(:states) ORDER BY j.id DESC LIMIT :limit"
            ),
            {"states": list(states), "limit": limit},
        ).all()
    return [_job(r) for r in rows]


def job(store: Database, job_id: int) -> JobRow:
    """One job, or NotFound."""
    _require_queue(store)
    with store.engine.connect() as connection:
        row = connection.execute(
            text(f"SELECT {_JOB_COLUMNS} FROM procrastinate_jobs j WHERE j.id = :id"),  # noqa: S608
            {"id": job_id},
        ).first()
    if row is None:
        raise NotFound(
            f"no job {job_id} in the queue (`safeaccess-server queue status` lists them)"
        )
    return _job(row)


def requeue(store: Database, job_id: int) -> JobRow:
    """Put a failed job back in its queue for its next run (its attempts count on). Only a
    failed job: a job waiting or running needs nothing, and a finished one is recorded."""
    found = job(store, job_id)
    if found.status != "failed":
        raise ConfigError(f"job {job_id} is {found.status}: only a failed job can be retried")
    with store.engine.begin() as connection:
        moved = connection.execute(
            text(
                "UPDATE procrastinate_jobs SET status = 'todo', scheduled_at = NULL, "
                "worker_id = NULL WHERE id = :id AND status = 'failed'"
            ),
            {"id": job_id},
        ).rowcount
        if moved:
            # An event as procrastinate's own retry writes, so the job's history shows it.
            connection.execute(
                text(
                    "INSERT INTO procrastinate_events (job_id, type) "
                    "VALUES (:id, 'deferred_for_retry')"
                ),
                {"id": job_id},
            )
    if not moved:
        raise ConfigError(f"job {job_id} changed meanwhile; look again with `queue failed`")
    return job(store, job_id)


def mark_failed(store: Database, job_id: int) -> JobRow:
    """Take a job out of the queue for good (failed): one waiting, or one whose worker is gone.
    A job a live worker runs is refused: stop that worker first."""
    found = job(store, job_id)
    if found.status not in ("todo", "doing"):
        raise ConfigError(f"job {job_id} is {found.status}: only a waiting or running job can fail")
    with store.engine.begin() as connection:
        if found.status == "doing":
            live = connection.execute(
                text(
                    "SELECT EXTRACT(EPOCH FROM (now() - w.last_heartbeat)) FROM "
                    "procrastinate_jobs j JOIN procrastinate_workers w ON w.id = j.worker_id "
                    "WHERE j.id = :id"
                ),
                {"id": job_id},
            ).scalar()
            if live is not None:
                raise ConfigError(
                    f"job {job_id} is running on a live worker (heartbeat {float(live):.0f} s "
                    "ago): stop that worker first, or wait for the job to end"
                )
        moved = connection.execute(
            text(
                "UPDATE procrastinate_jobs SET status = 'failed', worker_id = NULL "
                "WHERE id = :id AND status = CAST(:status AS procrastinate_job_status)"
            ),
            {"id": job_id, "status": found.status},
        ).rowcount
        if moved:
            connection.execute(
                text("INSERT INTO procrastinate_events (job_id, type) VALUES (:id, 'failed')"),
                {"id": job_id},
            )
    if not moved:
        raise ConfigError(f"job {job_id} changed meanwhile; look again with `queue status`")
    return job(store, job_id)
