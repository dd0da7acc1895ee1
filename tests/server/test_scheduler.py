"""The fair job queue: slots, per-researcher quota, and who gets a freed slot."""

from __future__ import annotations

import threading
import time

import pytest

from safeaccess.server.steps.scheduler import FairScheduler


class Jobs:
    """Jobs that hold their slot until released, recording the order in which they started."""

    def __init__(self, scheduler: FairScheduler):
        self.scheduler = scheduler
        self.started: list[str] = []
        self.release: dict[str, threading.Event] = {}
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, owner: str, name: str) -> None:
        self.release[name] = threading.Event()

        def job() -> None:
            with self.scheduler.slot(owner):
                with self._lock:
                    self.started.append(name)
                self.release[name].wait(30)

        thread = threading.Thread(target=job, daemon=True)
        self.threads.append(thread)
        thread.start()
        time.sleep(0.05)  # a deterministic arrival order

    def wait_started(self, count: int) -> list[str]:
        deadline = time.monotonic() + 10
        while len(self.started) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            return list(self.started)

    def finish(self) -> None:
        for event in self.release.values():
            event.set()
        for thread in self.threads:
            thread.join(10)


def test_a_newcomer_gets_the_first_freed_slot_ahead_of_a_queue() -> None:
    jobs = Jobs(FairScheduler(slots=2, per_owner=2))
    try:
        for i in range(4):
            jobs.submit("ada", f"ada{i}")
        assert jobs.wait_started(2) == ["ada0", "ada1"]
        jobs.submit("bob", "bob0")
        time.sleep(0.1)
        assert jobs.started == ["ada0", "ada1"]  # all slots busy: bob waits
        jobs.release["ada0"].set()
        assert jobs.wait_started(3)[2] == "bob0"  # one turnover, ahead of ada2 and ada3
        jobs.release["ada1"].set()
        assert jobs.wait_started(4)[3] == "ada2"
    finally:
        jobs.finish()
    assert jobs.started[4:] == ["ada3"]


def test_the_per_researcher_quota_leaves_slots_to_others() -> None:
    scheduler = FairScheduler(slots=3, per_owner=1)
    jobs = Jobs(scheduler)
    try:
        for i in range(3):
            jobs.submit("ada", f"ada{i}")
        jobs.submit("bob", "bob0")
        jobs.submit("carol", "carol0")
        assert sorted(jobs.wait_started(3)) == ["ada0", "bob0", "carol0"]
        assert scheduler.running == 3
        jobs.release["bob0"].set()
        time.sleep(0.1)
        # A free slot, but ada is at her quota: her queued jobs wait for her own to end.
        assert len(jobs.started) == 3 and scheduler.running == 2
        jobs.release["ada0"].set()
        assert jobs.wait_started(4)[3] == "ada1"
    finally:
        jobs.finish()
    assert scheduler.running == 0


def test_a_job_that_raises_gives_its_slot_back() -> None:
    scheduler = FairScheduler(slots=1, per_owner=1)
    with pytest.raises(RuntimeError), scheduler.slot("ada"):
        raise RuntimeError("the job failed")
    assert scheduler.running == 0
    with scheduler.slot("ada"):
        assert scheduler.running == 1


def test_a_scheduler_needs_slots() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        FairScheduler(slots=0, per_owner=1)
