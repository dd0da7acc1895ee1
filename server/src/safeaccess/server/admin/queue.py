"""`safeaccess-server queue status | failed | retry ID | fail ID`: the job queue for operators.

`status` shows each queue's jobs by state, the workers' last heartbeats and the jobs running
now; `failed` the failed jobs (a job fails when the centre failed it every time it was tried:
the sandbox unavailable, a dataset's file unreadable or changed; its step stays `running`);
`retry ID` puts a failed job back in its queue once the cause is fixed; `fail ID` gives up on
a job waiting or left by a dead worker and records its step as a lost job is recorded
(withheld, or a script crashed for the checkers), so the researcher's sequence does not wait
for it forever.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TYPE_CHECKING

from safeaccess.sandbox.backend import Job, RunResult, SandboxUnavailable
from safeaccess.server.config import DataDir, default_data_dir
from safeaccess.server.store import Store, queue_admin
from safeaccess.server.store.queue import SCRIPT_TASK

if TYPE_CHECKING:
    Group = argparse._SubParsersAction[argparse.ArgumentParser]


class NoSandbox:
    """The backend of an administration command: it runs nothing (`queue fail` records a
    step's outcome without computing it)."""

    name = "none"

    def check_available(self) -> None:
        raise SandboxUnavailable("an administration command runs no sandbox")

    def run(self, job: Job) -> RunResult:
        raise SandboxUnavailable("an administration command runs no sandbox")

    def abandon(self) -> None:
        pass

    def close(self) -> None:
        pass


def _data(args: argparse.Namespace) -> DataDir:
    return DataDir(args.data_dir if args.data_dir is not None else default_data_dir())


def _store(args: argparse.Namespace) -> Store:
    data = _data(args)
    return Store(data.database_url(data.load_config()))


def _when(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S}" if moment is not None else "-"


def _line(job: queue_admin.JobRow) -> str:
    task = "script" if job.task == SCRIPT_TASK else "table"
    return (
        f"{job.id:>8}  {job.queue:<14} {job.status:<9} {task:<6} "
        f"{job.sequence_id} step {job.index}  retries {job.attempts}"
        f"  last event {job.last_event or '-'} {_when(job.last_event_at)}"
    )


def _status(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        counts = queue_admin.job_counts(store)
        beats = queue_admin.worker_heartbeats(store)
        running = queue_admin.jobs(store, ("doing",), limit=args.limit)
    finally:
        store.close()
    queues = sorted({q for q, _state in counts})
    if not queues:
        print("the queue holds no job")
    for queue in queues:
        states = ", ".join(
            f"{state} {counts[(queue, state)]}"
            for state in queue_admin.STATES
            if (queue, state) in counts
        )
        print(f"queue {queue}: {states}")
    if beats:
        print(f"workers ({len(beats)} claim loops registered):")
        for worker, age in beats:
            print(f"  worker {worker}: last heartbeat {age:.1f} s ago")
    else:
        print("workers: none registered (no worker is running)")
    if running:
        print("running:")
        for job in running:
            print(f"  {_line(job)}  on worker {job.worker or '-'}")
    return 0


def _failed(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        failed = queue_admin.jobs(store, ("failed",), limit=args.limit)
    finally:
        store.close()
    if not failed:
        print("no failed job")
    for job in failed:
        print(_line(job))
    return 0


def _retry(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        job = queue_admin.requeue(store, args.id)
    finally:
        store.close()
    print(f"job {job.id} ({job.sequence_id} step {job.index}) is queued again on {job.queue}")
    return 0


def _fail(args: argparse.Namespace) -> int:
    from safeaccess.server.service import Service

    data = _data(args)
    store = _store(args)
    try:
        job = queue_admin.mark_failed(store, args.id)
    finally:
        store.close()
    # The step is recorded as a lost job's is, through the flow (one settle, exactly once).
    with Service(data.root, backend=NoSandbox(), role="worker") as service:
        if job.task == SCRIPT_TASK:
            service.scripts.record_lost(job.sequence_id, job.index, None)
            what = "its script run is recorded as crashed for the checkers"
        elif service.flow.record_lost(job.sequence_id, job.index, job.attempts + 1):
            what = "its step is withheld, as for a job whose workers died"
        else:
            what = "its step was settled already"
    print(f"job {job.id} ({job.sequence_id} step {job.index}) failed; {what}")
    return 0


def register(sub: Group, common: argparse.ArgumentParser) -> None:
    """The `queue` command group."""
    queue = sub.add_parser("queue", help="the job queue (execution: queue)").add_subparsers(
        dest="queue_command", required=True, metavar="ACTION"
    )
    status = queue.add_parser(
        "status",
        parents=[common],
        help="jobs by queue and state, the workers' last heartbeats, the running jobs",
    )
    status.add_argument("--limit", type=int, default=50, help="running jobs shown (default 50)")
    status.set_defaults(handler=_status)
    failed = queue.add_parser("failed", parents=[common], help="the failed jobs, newest first")
    failed.add_argument("--limit", type=int, default=50, help="jobs shown (default 50)")
    failed.set_defaults(handler=_failed)
    retry = queue.add_parser(
        "retry", parents=[common], help="put a failed job back in its queue (its cause fixed)"
    )
    retry.add_argument("id", type=int, help="the job's id (queue failed)")
    retry.set_defaults(handler=_retry)
    fail = queue.add_parser(
        "fail",
        parents=[common],
        help="give up on a waiting job or one of a dead worker: its step is recorded as lost",
    )
    fail.add_argument("id", type=int, help="the job's id (queue status)")
    fail.set_defaults(handler=_fail)
