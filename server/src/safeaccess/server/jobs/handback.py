"""A stopping worker hands the jobs it cannot finish back to the queue.

On SIGTERM a worker claims nothing more and lets the jobs it runs finish, its heartbeat going
on (`draining.py`). But it must end within 15 s of the signal whatever runs (issue 41), so a job
still running `shutdown.HAND_BACK_SECONDS` after the signal is handed back rather than cut by
the watchdog and left to the lease (which would record a script as crashed, or spend one of a
table job's runs, and make everyone wait `lease_seconds`):

1. its sandbox is killed (`Backend.abandon`): the run reports the centre's failure
   (`SandboxUnavailable`, hence `Unavailable`), so nothing is recorded for the step, which stays
   `running` (a script's: in review, not run);
2. its task raises `HandedBack` (as does a job whose query-set admission the signal
   interrupted, `shutdown.py`: it too recorded nothing), which `HandBackRetry` retries at once
   whatever the job's attempts, so procrastinate puts the job back in `todo` while this worker's heartbeat still
   holds it (no other worker ever sees it stalled);
3. the next free worker, another one or this one at its next start, claims it and runs it from
   scratch, once. A run that finished before its sandbox was killed is recorded and its job
   succeeds as usual: a step is recorded by one transaction or not at all.

procrastinate counts the hand-back in the job's `attempts` (its retry adds one): a table job
then handed back and lost with its worker twice is withheld one run early.
"""

from __future__ import annotations

import logging

from procrastinate import BaseRetryStrategy, RetryDecision
from procrastinate.jobs import Job

from safeaccess.sandbox.backend import Backend

log = logging.getLogger("safeaccess.server.worker")


class HandedBack(Exception):
    """A job whose run was stopped because its worker is stopping: it goes back to the queue."""


def begin(backend: Backend) -> None:
    """Stop every job this worker runs now (their sandboxes) and hand them back (blocking)."""
    log.warning("still running jobs at the stop's hand-back time: handing them back to the queue")
    backend.abandon()


class HandBackRetry(BaseRetryStrategy):
    """A handed-back job is queued again at once, whatever its attempts; any other exception
    is left to `inner` (the task's own strategy; None: no retry)."""

    def __init__(self, inner: BaseRetryStrategy | None):
        self.inner = inner

    def get_retry_decision(self, *, exception: BaseException, job: Job) -> RetryDecision | None:
        if isinstance(exception, HandedBack):
            return RetryDecision(retry_in={"seconds": 0})
        if self.inner is None:
            return None
        return self.inner.get_retry_decision(exception=exception, job=job)
