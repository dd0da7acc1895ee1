"""The queue's claim with dataset affinity: a worker prefers steps on datasets it holds warm.

procrastinate claims the waiting job of highest priority, oldest first
(`procrastinate_fetch_job_v2`). A worker that has a dataset's fork-server templates (or warm
containers) answers its steps in tens of milliseconds; one that must start them first takes the
dataset's load time. `safeaccess_fetch_job_v1` is procrastinate's claim with one more key in its
order, between the priority and the age:

    priority (fairness between researchers: never overridden),
    preferred first: the job's dataset is warm on this worker, or the job has waited longer
        than the affinity window (so a cold dataset's step is never starved by warm ones),
    oldest first.

Everything else is procrastinate's function unchanged: the same candidates (its lock rule, which
gives each researcher her lanes; status, queue and schedule filters), `FOR UPDATE SKIP LOCKED`,
the same update and the same row returned, so procrastinate's worker runs the job as its own.
Written here, not in procrastinate, because its claim orders by priority and age only; the
function is tested against procrastinate's own on the same jobs (tests/server/test_job_affinity.py).
A job's age is its `deferred` event, which procrastinate's trigger records at insert.
"""

from __future__ import annotations

from sqlalchemy import Connection

from safeaccess.server.store.queue import run_script

#: The function's SQL: procrastinate 3.x's `procrastinate_fetch_job_v2`, plus the warm key.
CLAIM_SQL = """
CREATE OR REPLACE FUNCTION safeaccess_fetch_job_v1(
    target_queue_names character varying[],
    p_worker_id bigint,
    warm_datasets text[],
    affinity_seconds double precision
)
    RETURNS procrastinate_jobs
    LANGUAGE plpgsql
AS $$
DECLARE
    found_jobs procrastinate_jobs;
BEGIN
    WITH candidate AS (
        SELECT jobs.*
            FROM procrastinate_jobs AS jobs
            WHERE
                NOT EXISTS (
                    SELECT 1
                        FROM procrastinate_jobs AS other_jobs
                        WHERE
                            jobs.lock IS NOT NULL
                            AND other_jobs.lock = jobs.lock
                            AND (
                                other_jobs.status = 'doing'
                                OR (
                                    other_jobs.status = 'todo'
                                    AND (
                                        other_jobs.priority > jobs.priority
                                        OR (
                                            other_jobs.priority = jobs.priority
                                            AND other_jobs.id < jobs.id
                                        )
                                    )
                                )
                            )
                )
                AND jobs.status = 'todo'
                AND (target_queue_names IS NULL OR jobs.queue_name = ANY(target_queue_names))
                AND (jobs.scheduled_at IS NULL OR jobs.scheduled_at <= now())
            ORDER BY
                jobs.priority DESC,
                (
                    coalesce(jobs.args->>'dataset' = ANY(warm_datasets), false)
                    OR NOT EXISTS (
                        SELECT 1 FROM procrastinate_events AS ev
                            WHERE ev.job_id = jobs.id AND ev.type = 'deferred'
                            AND ev.at > clock_timestamp() - make_interval(secs => affinity_seconds)
                    )
                ) DESC,
                jobs.id ASC
            LIMIT 1
            FOR UPDATE OF jobs SKIP LOCKED
    )
    UPDATE procrastinate_jobs
        SET status = 'doing', worker_id = p_worker_id
        FROM candidate
        WHERE procrastinate_jobs.id = candidate.id
        RETURNING procrastinate_jobs.* INTO found_jobs;

    RETURN found_jobs;
END;
$$;
"""

DROP_SQL = (
    "DROP FUNCTION IF EXISTS safeaccess_fetch_job_v1("
    "character varying[], bigint, text[], double precision)"
)

#: The claim as procrastinate's worker sends it (the same columns as its own `fetch_job`).
FETCH_SQL = (
    "SELECT id, status, task_name, priority, lock, queueing_lock, args, scheduled_at, "
    "queue_name, attempts, worker_id FROM safeaccess_fetch_job_v1("
    "%(queues)s::varchar[], %(worker_id)s, %(warm)s::text[], %(affinity_seconds)s)"
)


def install_claim(connection: Connection) -> bool:
    """Create (or replace) the claim function (PostgreSQL, after procrastinate's schema)."""
    if connection.dialect.name != "postgresql":
        return False
    run_script(connection, CLAIM_SQL)
    return True


def uninstall_claim(connection: Connection) -> bool:
    """Drop the claim function (PostgreSQL)."""
    if connection.dialect.name != "postgresql":
        return False
    connection.exec_driver_sql(DROP_SQL)
    return True
