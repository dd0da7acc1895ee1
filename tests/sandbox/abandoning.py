"""One check shared by every backend's test of `abandon` (a stopping worker hands its jobs back,
server/jobs/handback.py): a job still running is stopped at once, and its run reports the
centre's failure, never the script's own."""

from __future__ import annotations

import threading
import time
from typing import Any

from safeaccess.sandbox.backend import STOPPING, Job, SandboxUnavailable


def abandon_mid_run(backend: Any, sleeper: Job, *, start_within: float, stop_within: float) -> None:
    """Run `sleeper` (a script that sleeps) on `backend`, abandon the backend once the job is
    running, and assert that the run ended within `stop_within` seconds as the centre's
    failure (`SandboxUnavailable` saying the worker is stopping)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            backend.run(sleeper)
        except BaseException as exc:  # reported below
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + start_within
    while not backend._running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert backend._running, "the script's sandbox did not start"
    stopped = time.monotonic()
    backend.abandon()
    thread.join(timeout=30)
    assert time.monotonic() - stopped < stop_within
    assert len(raised) == 1 and type(raised[0]) is SandboxUnavailable, raised
    assert STOPPING in str(raised[0])
