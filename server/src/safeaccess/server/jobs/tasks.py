"""The queue's two tasks, run by `safeaccess-server worker` through procrastinate.

A task receives the step's key and finds everything else in the database and on the shared
storage: the worker hosts hold no state of their own beyond warm sandboxes. Both tasks call the
same code an API server uses when it runs steps itself (`Flow`, `ScriptRuns`), so a step
computes and is recorded the same way wherever it runs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import procrastinate
import psycopg
from procrastinate import JobContext, RetryStrategy
from sqlalchemy.exc import OperationalError

from safeaccess.server import metrics, shutdown
from safeaccess.server.errors import Unavailable
from safeaccess.server.jobs import handback
from safeaccess.server.jobs.datasets import DatasetCheck
from safeaccess.server.logs import step_context
from safeaccess.server.store.queue import SCRIPT_TASK, TABLE_TASK

if TYPE_CHECKING:
    from safeaccess.server.service import Service

log = logging.getLogger("safeaccess.server.worker")

#: How a script's job names itself in the log (a table step's: "job").
SCRIPT_WHAT = "script job"

#: Seconds between the tries of a job whose sandbox was unavailable.
RETRY_WAIT_SECONDS = 2


def _service(context: JobContext) -> Service:
    service: Service = context.additional_context["service"]
    return service


def _check(context: JobContext) -> DatasetCheck:
    check: DatasetCheck = context.additional_context["datasets"]
    return check


@contextlib.contextmanager
def _reported(context: JobContext, what: str, sequence_id: str, index: int) -> Iterator[None]:
    """Every line of the job carries its sequence id and step; a failure is logged in one line
    with its cause (the traceback at debug level) and raised on to procrastinate."""
    with step_context(sequence_id, index):
        try:
            yield
        except Unavailable as exc:
            if not shutdown.stopping():
                _log_failure(context, what, sequence_id, index, exc)
                raise
            # Cut short by this worker's stop (its admission interrupted at the signal, or its
            # sandbox stopped at the hand-back): nothing was recorded, and the job goes back to
            # the queue at once, not as a failed try (`handback.py`).
            log.warning(
                "%s %s step %d handed back to the queue: this worker is stopping",
                what,
                sequence_id,
                index,
            )
            metrics.JOBS_HANDED_BACK.labels(task="script" if what == SCRIPT_WHAT else "step").inc()
            raise handback.HandedBack(str(exc)) from exc
        except Exception as exc:
            _log_failure(context, what, sequence_id, index, exc)
            raise


def _log_failure(
    context: JobContext, what: str, sequence_id: str, index: int, exc: Exception
) -> None:
    """One line with the failure's cause; the traceback at debug level."""
    cause = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    log.error(
        "%s %s step %d failed (run %d): %s%s",
        what,
        sequence_id,
        index,
        context.job.attempts + 1,
        type(exc).__name__,
        f": {cause}" if cause else "",
    )
    log.debug("%s %s step %d: traceback", what, sequence_id, index, exc_info=True)


@dataclass(frozen=True)
class StepJob:
    """What a step's job was queued with (both tasks take the same arguments)."""

    sequence_id: str
    index: int
    researcher: str
    #: The rows as the step was queued (`queue.Carried`), used on the job's first attempt only;
    #: any later one (its worker died, or a retry) reads them afresh. A script's job has none.
    carried: dict[str, Any] | None


def run_step(context: JobContext, job: StepJob) -> None:
    """A table step's job: compute and record the step (`Flow.run_job`)."""
    with _reported(context, "job", job.sequence_id, job.index):
        ran = _service(context).flow.run_job(
            job.sequence_id,
            job.index,
            check=_check(context).verify,
            carried=job.carried if context.job.attempts == 0 else None,
        )
        log.info(
            "job %s step %d for %s: %s",
            job.sequence_id,
            job.index,
            job.researcher,
            "ran" if ran else "already settled",
        )


def run_script(context: JobContext, job: StepJob) -> None:
    """A script's job: run it (`ScriptRuns.run_now`) unless its sequence is gone."""
    service = _service(context)
    with _reported(context, SCRIPT_WHAT, job.sequence_id, job.index):
        seq = service.store.get_sequence(job.sequence_id)
        if seq is None:
            return
        _check(context).verify(service.store.get_dataset(seq.dataset_id))
        service.scripts.run_now(job.sequence_id, job.index)
        log.info("script job %s step %d for %s ran", job.sequence_id, job.index, job.researcher)


def make_app(conninfo: str, max_attempts: int) -> procrastinate.App:
    """The procrastinate app of a worker host (or of anything reading the queue)."""
    # (procrastinate's pool checks each connection before use, so a worker survives a
    # PostgreSQL restart.) Its claims, heartbeats and finishes commit without waiting for the
    # WAL flush: one lost in a crash of PostgreSQL only runs a job again, and a step records
    # once whatever runs it. The job itself is queued in the step's own, durable transaction.
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=conninfo, kwargs={"options": "-c synchronous_commit=off"}
        )
    )
    # Tried again only when the centre failed (the sandbox unavailable, the database away:
    # PostgreSQL restarting), never on the analysis's own failures: those are outcomes, recorded
    # by the flow. A run again records once: the settle is guarded by the sequence's version.
    # (procrastinate's max_attempts counts the runs before the last: 2 gives 3 runs in all;
    # 0 would mean "without end", hence no retry at all for a single run.)
    # A job handed back by a stopping worker is queued again whatever its attempts
    # (`handback.py`).
    retry = handback.HandBackRetry(
        RetryStrategy(
            max_attempts=max_attempts - 1,
            wait=RETRY_WAIT_SECONDS,
            retry_exceptions={Unavailable, OperationalError, psycopg.OperationalError},
        )
        if max_attempts > 1
        else None
    )

    def register(name: str, run: Callable[[JobContext, StepJob], None]) -> None:
        @app.task(name=name, pass_context=True, retry=retry)
        def task(
            context: JobContext,
            sequence_id: str,
            index: int,
            researcher: str,
            dataset: str = "",
            carried: dict[str, Any] | None = None,
        ) -> None:
            # (`dataset` is for the claim's affinity, `store/affinity.py`; the step names its own.)
            run(context, StepJob(sequence_id, index, researcher, carried))

    register(TABLE_TASK, run_step)
    register(SCRIPT_TASK, run_script)
    return app
