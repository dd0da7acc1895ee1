"""Jobs whose worker died: procrastinate's heartbeats are the lease.

A worker host sends a heartbeat every `lease_seconds / 3`; one silent for `lease_seconds` is
presumed dead and the jobs it held (`doing`) are stalled. Every worker looks for stalled jobs
every `lease_seconds / 3` and settles them:

- a table job is queued again, at most `max_attempts` runs in all; after the last, its step is
  withheld (`Flow.record_lost`): what kills worker hosts may depend on the records;
- a script job fails and its run is recorded as crashed for the checkers
  (`ScriptRuns.record_lost`), and it is never run again by itself: a script controls its
  process and could read data from whether, and when, its host dies.

Two workers may find the same stalled job: procrastinate moves a job out of `doing` once, the
other's attempt fails and is ignored, and the step's settle is itself exact-once (its row's
state is checked in the settling transaction).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import procrastinate
from procrastinate.jobs import Job, Status
from procrastinate.manager import JobManager

from safeaccess.server.store.queue import SCRIPT_TASK

if TYPE_CHECKING:
    from safeaccess.server.service import Service

log = logging.getLogger("safeaccess.server.worker")


async def settle_stalled(
    app: procrastinate.App, service: Service, *, lease_seconds: float, max_attempts: int
) -> int:
    """Settle the stalled jobs once (see the module's docstring); how many were settled."""
    manager = app.job_manager
    stalled = await manager.get_stalled_jobs(seconds_since_heartbeat=lease_seconds)
    settled = 0
    for job in stalled:
        try:
            await _settle(manager, service, job, max_attempts)
            settled += 1
        except Exception as exc:  # another worker settled it first: nothing to do
            log.info("stalled job %s left to another worker: %s", job.id, exc)
    await manager.prune_stalled_workers(lease_seconds)
    return settled


async def _settle(manager: JobManager, service: Service, job: Job, max_attempts: int) -> None:
    assert job.id is not None
    sequence_id, index = str(job.task_kwargs["sequence_id"]), int(str(job.task_kwargs["index"]))
    runs = job.attempts + 1
    if job.task_name == SCRIPT_TASK:
        await manager.finish_job(job, status=Status.FAILED, delete_job=False)
        await asyncio.to_thread(service.scripts.record_lost, sequence_id, index, None)
        log.warning(
            "script job %s/%d lost with its worker: recorded as crashed", sequence_id, index
        )
    elif runs < max_attempts:
        await manager.retry_job(job)
        log.warning(
            "job %s/%d lost with its worker (run %d of %d): queued again",
            sequence_id,
            index,
            runs,
            max_attempts,
        )
    else:
        await manager.finish_job(job, status=Status.FAILED, delete_job=False)
        await asyncio.to_thread(service.flow.record_lost, sequence_id, index, runs)
        log.warning("job %s/%d lost with its worker %d times: withheld", sequence_id, index, runs)
