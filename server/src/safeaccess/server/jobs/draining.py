"""A procrastinate worker that keeps its lease while it drains.

procrastinate's worker stops its heartbeat first when it is told to stop, then waits for the
jobs it runs (`Worker._shutdown`). A job that then runs longer than `lease_seconds` looks, to
every other worker, like a job whose worker died: they settle it as stalled and run it again
while the stopping worker finishes it (issue 43: a 60-second script on a stopping worker was
recorded `script_crashed`). Here the heartbeat goes on until the last job has finished and the
worker has unregistered, so a live worker's lease never expires, stopping or not; a worker that
dies stops beating at once, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from procrastinate.worker import Worker

log = logging.getLogger("safeaccess.server.worker")


class DrainingWorker(Worker):
    """procrastinate's `Worker`, whose heartbeat lasts until its jobs have drained."""

    async def _shutdown(self, side_tasks: list[asyncio.Task[Any]]) -> None:
        beating = asyncio.create_task(self._beat_while_draining(), name="draining heartbeat")
        try:
            await super()._shutdown(side_tasks)
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating

    async def _beat_while_draining(self) -> None:
        while True:
            worker_id = self.worker_id
            if worker_id is None:  # unregistered: nothing left to keep
                return
            if self._running_jobs:
                try:
                    await self.app.job_manager.update_heartbeat(worker_id)
                except Exception as exc:  # the database away: the next beat tries again
                    log.warning("heartbeat while draining failed (%s); trying again", exc)
            await asyncio.sleep(self.update_heartbeat_interval)
