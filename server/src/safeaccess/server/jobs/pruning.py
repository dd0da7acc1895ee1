"""Finished jobs are deleted after `queue.keep_jobs_hours`.

A job row is the queue's working state, not a record: what a step did is in the audit log and
in the step's own row. Finished jobs are kept a while (a replica answers a re-sent reveal from a
failed job's status; an operator may look at recent runs) and then deleted by procrastinate's
own `delete_old_jobs`, so the table, and the lookups by job key that scan its finished rows,
stay small however long the centre runs.
"""

from __future__ import annotations

import procrastinate

#: How often each worker deletes the old finished jobs (any worker may: deleting is idempotent).
PRUNE_SECONDS = 3600.0


async def prune_finished(app: procrastinate.App, keep_hours: int) -> None:
    """Delete the jobs that succeeded or failed more than `keep_hours` ago; waiting and running
    jobs are never touched."""
    await app.job_manager.delete_old_jobs(nb_hours=keep_hours, include_failed=True)
