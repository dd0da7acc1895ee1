"""Writing scopes' full state files in the background, after their steps are recorded.

An admitted step writes a delta of the file it was admitted from (`gate.StateFiles.save`); the
full state it describes (40 MB at 10 M records) is written afterwards by this module's one
worker thread, so no step waits for it, and a cold load reads that full file instead of
replaying the chain of deltas. Jobs are keyed by scope: a newer job for a scope replaces one
that has not started (only the newest state of a scope is worth a full file), so a burst of
admissions costs one full write, not one per step.

One worker for the whole process bounds the background work to one write at a time, whatever
the number of scopes. The worker is a `concurrent.futures` thread: at interpreter exit the jobs
already queued are finished before the process ends (a kill mid-write leaves only a temporary
file, which no reader opens; the scope's next admission queues a newer full state).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("safeaccess.server")

Job = Callable[[], object]


class Compactor:
    """A background queue of full-state writes, at most one pending per key (the newest)."""

    def __init__(self) -> None:
        self._guard = threading.Condition()
        self._pending: dict[Hashable, Job] = {}
        self._running = 0  # jobs submitted to the pool and not yet finished
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, key: Hashable, job: Job) -> None:
        """Run `job` in the background; it replaces a job of `key` that has not started."""
        with self._guard:
            replaced = key in self._pending
            self._pending[key] = job
            if replaced:
                return  # the queued run of `key` will pick the newer job up
            self._running += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="qss-compact", initializer=_yield_cpu
                )
            pool = self._pool
        pool.submit(self._run, key)

    def _run(self, key: Hashable) -> None:
        with self._guard:
            job = self._pending.pop(key, None)
        try:
            if job is not None:
                job()
        except Exception:  # a failed full write costs a longer cold load, never a verdict
            log.warning("writing a full auditor state in the background failed", exc_info=True)
        finally:
            with self._guard:
                self._running -= 1
                self._guard.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every submitted job has run; False if `timeout` seconds passed first."""
        with self._guard:
            return self._guard.wait_for(lambda: self._running == 0, timeout)


#: How much lower the worker's CPU priority is than the server's other threads (Linux's nice
#: is per thread): on a busy machine a step's own work goes first, the full write after it.
NICE = 10


def _yield_cpu() -> None:
    """Lower this (the worker) thread's CPU priority where the platform allows it."""
    # not Linux, or not permitted: the worker runs at normal priority
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)


#: The process's compactor, shared by every `StateFiles` (one background write at a time).
COMPACTOR = Compactor()
