"""`safeaccess-server worker`: a worker host of the job queue.

It connects out to PostgreSQL and reads the data directory (shared storage, read-only for it);
it accepts no connection. It runs today's sandbox backends unchanged (the process backend's
fork-server templates, Docker's warm pool) with `--slots` jobs at once for interactive steps
and `--script-slots` for scripts, each a procrastinate worker on its own queues, so queued
scripts never take a table's slot. Fairness between researchers and the per-researcher cap are
in the jobs themselves (`store/queue.py`: priority and lanes), so they hold across all workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import procrastinate
import psycopg
from procrastinate.exceptions import ConnectorException

from safeaccess.sandbox.backend import SandboxError
from safeaccess.sandbox.config import BackendName
from safeaccess.sandbox.factory import make_backend
from safeaccess.server import logs, shutdown
from safeaccess.server.config import DataDir, QueueConfig
from safeaccess.server.errors import ConfigError
from safeaccess.server.jobs import handback
from safeaccess.server.jobs.affinity import AffinityJobManager, WarmDatasets
from safeaccess.server.jobs.datasets import DatasetCheck, unreadable
from safeaccess.server.jobs.draining import DrainingWorker
from safeaccess.server.jobs.leases import settle_stalled
from safeaccess.server.jobs.pruning import PRUNE_SECONDS, prune_finished
from safeaccess.server.jobs.tasks import make_app
from safeaccess.server.store import catalogue
from safeaccess.server.store.queue import SCRIPTS, STEPS
from safeaccess.server.store.settled import conninfo

if TYPE_CHECKING:
    from safeaccess.server.service import Service

log = logging.getLogger("safeaccess.server.worker")


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker host runs (the command's options)."""

    slots: int = 2
    script_slots: int = 1
    backend: BackendName | None = None  # None: the configured one
    queues: tuple[str, ...] = (STEPS, SCRIPTS)
    name: str | None = None
    #: Serve Prometheus metrics on this port (`metrics.py`), on `metrics_host`; None: none.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"


def _one_line_when_the_database_is_away(record: logging.LogRecord) -> bool:
    """procrastinate logs a lost database connection with its traceback. A PostgreSQL restart
    is routine and the worker recovers, so the log gets one line per loss instead."""
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, ConnectorException | psycopg.OperationalError):
        cause = error.__cause__ or error
        record.msg = f"{record.getMessage()}: {cause!s}".strip() + " (the database is away)"
        record.args = None
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


def _job_failure_without_traceback(record: logging.LogRecord) -> bool:
    """procrastinate logs a failed job with its traceback (about 75 lines). The task logs the
    failure in one line with its cause (`tasks.py`), the traceback at debug level only, so
    procrastinate's own line of a failed job is left out, and any other end-of-job line it
    writes loses its traceback."""
    action = getattr(record, "action", None)
    if action in FAILED_JOB_ACTIONS:
        return False
    if record.exc_info and action in JOB_OUTCOME_ACTIONS:
        record.exc_info = None
        record.exc_text = None
    return True


#: procrastinate's `action` of the lines that end a job (`Worker._log_job_outcome`).
FAILED_JOB_ACTIONS = frozenset({"job_error", "job_error_retry"})
JOB_OUTCOME_ACTIONS = frozenset({"job_success", "job_aborted", "job_aborted_retry"})


def _log_procrastinate() -> None:
    """procrastinate's warnings and errors to standard error, beside the server's own log
    (with the handler `logs.configure` gave it, if any)."""
    logger = logging.getLogger("procrastinate")
    # A logger's filters see only the records logged to it, not those its children pass up:
    # they go on procrastinate's module loggers ("procrastinate.worker" logs a failed job).
    children = [n for n in logging.root.manager.loggerDict if n.startswith("procrastinate.")]
    for name in ["procrastinate", *children]:
        logging.getLogger(name).addFilter(_one_line_when_the_database_is_away)
        logging.getLogger(name).addFilter(_job_failure_without_traceback)
    if logger.handlers:
        return
    handler = logs.StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)


def run_worker(root: Path, options: WorkerOptions) -> None:
    """Run until SIGTERM or SIGINT: claim jobs, run them, settle those of dead workers. On the
    signal it claims nothing more and exits once the jobs it runs are recorded."""
    _log_procrastinate()
    from safeaccess.server.heap import freeze_startup_objects
    from safeaccess.server.service import Service

    data = DataDir(root)
    config = data.load_config()
    if config.execution != "queue":
        raise ConfigError(
            "this data directory's server runs steps itself (execution = 'local'): set "
            "execution: queue and a PostgreSQL database_url in its config.yaml for workers"
        )
    sandbox = config.sandbox
    if options.backend is not None:
        sandbox = sandbox.model_copy(update={"backend": options.backend})
    try:
        backend = make_backend(sandbox, concurrency=options.slots + options.script_slots)
    except SandboxError as exc:
        raise ConfigError(f"the sandbox backend is unusable on this worker: {exc}") from exc
    service = Service(root, backend=backend, role="worker")
    # A worker that cannot read a dataset would take that dataset's jobs and fail every one of
    # them: it refuses to start instead, and says which files and why.
    problems = unreadable(service.data.root, catalogue.all_datasets(service.store))
    if problems:
        service.close()
        shown = "; ".join(problems[:5]) + (
            f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        )
        raise ConfigError(
            f"this worker (uid {os.getuid()}) cannot read {len(problems)} dataset file(s), so "
            f"it will not start: {shown} (run it as the user that owns the data directory)"
        )
    if options.metrics_port is not None:
        # prometheus-client's own HTTP server, in a thread: /metrics of this worker.
        from prometheus_client import start_http_server

        start_http_server(options.metrics_port, addr=options.metrics_host)
        log.info("metrics on http://%s:%d/metrics", options.metrics_host, options.metrics_port)
    freeze_startup_objects()
    try:
        asyncio.run(
            _serve(
                service,
                options,
                config.queue,
                data.database_url(config),
            )
        )
    finally:
        service.close()


async def _serve(service: Service, options: WorkerOptions, queue: QueueConfig, url: str) -> None:
    lease = queue.lease_seconds
    app = make_app(conninfo(url), queue.max_attempts)
    # Claims prefer the datasets this worker holds warm (fairness first; `store/affinity.py`).
    app.job_manager = AffinityJobManager(app.connector, WarmDatasets(), queue.affinity_seconds)
    name = options.name or f"{socket.gethostname()}"
    context = {"service": service, "datasets": DatasetCheck(service.data.root)}
    step_queues = [q for q in options.queues if q != SCRIPTS]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def hand_back() -> None:
        # (in a thread: killing sandboxes may wait on them, and the heartbeat must go on)
        handing.append(asyncio.ensure_future(asyncio.to_thread(handback.begin, service.backend)))

    handing: list[asyncio.Future[None]] = []

    def stopping() -> None:
        # Running admissions end at once; jobs still running `HAND_BACK_SECONDS` after the
        # signal go back to the queue (`handback.py`); the process ends within seconds
        # whatever runs.
        if not stop.is_set():
            loop.call_later(shutdown.HAND_BACK_SECONDS, hand_back)
        shutdown.begin()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping)
    common: dict[str, Any] = {
        "additional_context": context,
        "install_signal_handlers": False,
        "update_heartbeat_interval": max(1.0, lease / 3),
        "stalled_worker_timeout": lease,
        # New jobs are announced by NOTIFY; polling too bounds the wait if one is lost (the
        # listening connection dropped with PostgreSQL).
        "fetch_job_polling_interval": 1.0,
    }
    async with app.open_async():
        loops = []
        if step_queues and options.slots > 0:
            loops.append((step_queues, options.slots, f"{name}/steps"))
        if SCRIPTS in options.queues and options.script_slots > 0:
            loops.append(([SCRIPTS], options.script_slots, f"{name}/scripts"))
        runs = [
            asyncio.create_task(_claim_loop(app, queues, slots, loop_name, common, stop))
            for queues, slots, loop_name in loops
        ]
        reaper = asyncio.create_task(_reap(app, service, queue, stop))
        log.info(
            "worker %s: %d slot(s) on %s, %d script slot(s)",
            name,
            options.slots,
            ",".join(step_queues) or "-",
            options.script_slots,
        )
        print(f"safeaccess worker {name} ready", flush=True)
        await stop.wait()
        for task in [*runs, reaper]:
            task.cancel()
        for task in [*runs, reaper]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for future in handing:
            await future


async def _claim_loop(
    app: procrastinate.App,
    queues: list[str],
    slots: int,
    name: str,
    options: dict[str, Any],
    stop: asyncio.Event,
) -> None:
    """One procrastinate worker loop, started again whenever it ends before the worker is
    told to stop. procrastinate stops a loop whose LISTEN connection could not be made again
    (PostgreSQL restarting), and a loop whose heartbeat lapsed while PostgreSQL was away may
    have been pruned by another worker, so that its claims fail: a new loop registers afresh
    (the jobs the old one held were settled as stalled)."""
    while not stop.is_set():
        try:
            # procrastinate's worker, whose heartbeat lasts while it drains (`draining.py`).
            await DrainingWorker(
                app=app, queues=queues, concurrency=slots, name=name, **options
            ).run()
            if stop.is_set():
                return
            log.warning("worker loop %s stopped by itself; starting it again", name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a database error: the loop starts again, as designed
            log.warning("worker loop %s stopped (%s); starting it again", name, exc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1.0)


async def _reap(
    app: procrastinate.App, service: Service, queue: QueueConfig, stop: asyncio.Event
) -> None:
    """Settle stalled jobs every `lease_seconds / 3`; delete old finished jobs every hour."""
    lease = queue.lease_seconds
    pruned_at: float | None = None
    while not stop.is_set():
        try:
            await settle_stalled(app, service, lease_seconds=lease, max_attempts=queue.max_attempts)
        except Exception:
            log.exception("settling stalled jobs failed; trying again")
        now = time.monotonic()
        if pruned_at is None or now - pruned_at >= PRUNE_SECONDS:
            try:
                await prune_finished(app, queue.keep_jobs_hours)
                pruned_at = now
            except Exception as exc:  # the database away: the next round tries again
                log.warning("deleting old finished jobs failed (%s); trying again", exc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=max(1.0, lease / 3))
