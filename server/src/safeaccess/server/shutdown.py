"""Stopping within seconds of SIGTERM, whatever is running.

`serve` and `worker` call `begin` when told to stop: every query-set admission in the process
ends at once with `rules.qss.guard.Interrupted` (its step records nothing and stays `running`;
it is run again at the next start, `steps/orphans.py`, or by another replica or worker), and a
watchdog ends the process `GRACE_SECONDS` later if an orderly stop has not (a sandbox run, a
request thread that does not end). What it cuts short was never recorded, so nothing is lost:
every step's outcome is recorded in one transaction or not at all.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from safeaccess.rules.qss.guard import interrupt_all

log = logging.getLogger("safeaccess.server")

#: Seconds from SIGTERM to the forced end of the process (the issue's bound is 15 s).
GRACE_SECONDS = 12.0
#: Seconds from SIGTERM until a worker hands back the jobs it still runs (`jobs/handback.py`):
#: long enough for most jobs to finish, short enough to leave the hand-back time before the
#: watchdog.
HAND_BACK_SECONDS = 9.0

_started = threading.Event()


def stopping() -> bool:
    """True once the process has been told to stop (`begin`)."""
    return _started.is_set()


def begin(grace: float = GRACE_SECONDS) -> None:
    """The process is stopping: interrupt the admissions and arm the watchdog (once)."""
    interrupt_all()
    if _started.is_set():
        return
    _started.set()
    deadline = time.monotonic() + grace

    def watchdog() -> None:
        time.sleep(max(0.0, deadline - time.monotonic()))
        log.warning("still stopping %.0f s after the signal: ending the process now", grace)
        logging.shutdown()
        os._exit(0)

    threading.Thread(target=watchdog, name="stop-watchdog", daemon=True).start()
