"""Steps whose server died mid-step, run again by another replica without waiting for the
client (execution = "local" on PostgreSQL; with the job queue, the job's lease does this).

Every few seconds each API replica lists the steps recorded `running` and tries each one's
sequence lease (`store/sequence_leases.py`). A replica computing a step holds its sequence's
lease from before the step is recorded until it is settled, so a lease it can take belongs to a
step nobody computes: its server died (its session, and the lease, ended with it). The replica
then runs the step as a re-sent reveal would: the same stored body, the same checks, recorded
once.
"""

from __future__ import annotations

import logging
import threading

from safeaccess.server.steps.flow import Flow
from safeaccess.server.store.running_steps import running_steps

log = logging.getLogger("safeaccess.server")

#: Seconds between two looks for orphaned steps.
SWEEP_SECONDS = 2.0


def sweep(flow: Flow) -> int:
    """Run every orphaned step once; the number run."""
    leases = flow.leases
    assert leases is not None, "orphans are found by the sequence leases (PostgreSQL, local)"
    resumed = 0
    for sequence_id, index in running_steps(flow.store):
        local = flow.local_lock(sequence_id)
        if not local.acquire(blocking=False):
            continue  # this process works on it
        try:
            if not leases.try_take(sequence_id):
                continue  # another live replica works on it
            try:
                if flow.resume_orphan(sequence_id, index):
                    resumed += 1
            finally:
                leases.give_back(sequence_id)
        finally:
            local.release()
    return resumed


class OrphanSweeper:
    """A thread that sweeps every `interval` seconds until `close`."""

    def __init__(self, flow: Flow, interval: float = SWEEP_SECONDS):
        self.flow = flow
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orphan-steps", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                sweep(self.flow)
            except Exception as exc:  # the database away, a step's own error: next round
                log.warning("looking for steps left by a stopped server failed: %s", exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def resume_at_start(flow: Flow) -> int:
    """Run every step left `running` by this server's previous run (a stop or a crash mid-step),
    once, when a server that is the only one running steps on its database starts (SQLite: the
    database file belongs to one server process, so every running step is an orphan). Each is
    run as a re-sent reveal would be: the same stored body and checks, recorded once; a
    centre's failure (`Unavailable`) leaves it running for the next start or the client's
    re-sent reveal. The number run."""
    resumed = 0
    for sequence_id, index in running_steps(flow.store):
        with flow.local_lock(sequence_id):
            try:
                if flow.resume_orphan(sequence_id, index):
                    resumed += 1
            except Exception as exc:  # this step's own failure: the others are still run
                log.warning(
                    "sequence %s step %d left running by the last run: not run again (%s)",
                    sequence_id,
                    index,
                    exc,
                )
    return resumed


class StartupResume:
    """`resume_at_start` in a thread, so that the server answers meanwhile (a step the client
    re-sends first is computed once: both take the sequence's lock and the later one finds it
    settled)."""

    def __init__(self, flow: Flow):
        self.resumed = 0
        self._thread = threading.Thread(
            target=self._run, args=(flow,), name="resume-steps", daemon=True
        )
        self._thread.start()

    def _run(self, flow: Flow) -> None:
        try:
            self.resumed = resume_at_start(flow)
        except Exception as exc:  # the database away at start: the client's re-sent reveal
            log.warning("resuming the steps left running by the last run failed: %s", exc)
            return
        if self.resumed:
            log.info("ran %d step(s) left running by the last run", self.resumed)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)
