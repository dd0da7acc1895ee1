"""Readiness apart from liveness.

`/v1/health` says the process is up (liveness: restart it if it does not answer).
`/v1/ready` says whether it can serve a step now (readiness: the load balancer sends it
requests only then). It fails while:

- the database does not answer;
- with the job queue (an API replica), no worker has sent a heartbeat within `lease_seconds`:
  a reveal would wait `wait_seconds` and answer `running`;
- the sandbox cannot start (a replica that runs its steps itself, or a worker).

The checks are cached for `CACHE_SECONDS`, so a load balancer polling several times a second
costs one database round trip a second.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel

from safeaccess.sandbox.backend import Backend, SandboxError
from safeaccess.server import metrics
from safeaccess.server.store.reachable import ping

if TYPE_CHECKING:
    from safeaccess.server.config import ServerConfig
    from safeaccess.server.store.database import Database

log = logging.getLogger("safeaccess.server")

#: How long a readiness answer is reused.
CACHE_SECONDS = 1.0


class Readiness(BaseModel):
    """The answer of `/v1/ready`: ready, or the reasons why not (one line each)."""

    ready: bool
    problems: list[str]
    sandbox: str
    sandbox_mode: str


def sandbox_mode(backend: Backend) -> str:
    """How the sandbox runs here: the process backend's "forkserver" (fast) or "warm" (a new
    bubblewrap sandbox per job, the slow fallback); another backend's name."""
    mode = getattr(backend, "mode", None)
    return str(mode) if mode is not None else backend.name


def announce_sandbox(backend: Backend, role: str) -> None:
    """Log the sandbox mode at start and set its gauge. A slow fallback is the backend's own
    WARNING (`SANDBOX FALLBACK: ...`, with the kernel's reason), logged once where it is found."""
    mode = sandbox_mode(backend)
    metrics.SANDBOX_MODE.labels(backend=backend.name, mode=mode).set(1)
    log.info("%s: sandbox %s, mode %s", role, backend.name, mode)


class Checked(Protocol):
    """What readiness reads of a service (a protocol, so this module does not import the
    service that holds its check)."""

    @property
    def store(self) -> Database: ...
    @property
    def config(self) -> ServerConfig: ...
    @property
    def role(self) -> str: ...
    @property
    def backend(self) -> Backend: ...


class ReadinessCheck:
    """The checks behind `/v1/ready`, for one service (see the module's docstring)."""

    def __init__(self, service: Checked):
        self.service = service
        self._lock = threading.Lock()
        self._cached: tuple[float, Readiness] | None = None

    def __call__(self) -> Readiness:
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < CACHE_SECONDS:
                return self._cached[1]
            answer = self._check()
            self._cached = (time.monotonic(), answer)
            if not answer.ready:
                log.warning("not ready: %s", "; ".join(answer.problems))
            return answer

    def _check(self) -> Readiness:
        service = self.service
        problems: list[str] = []
        database = True
        try:
            ping(service.store.engine)
        except Exception as exc:  # any failure to reach it: the database is what is named
            database = False
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            problems.append(f"the database does not answer: {first}")
        queued = service.config.execution == "queue"
        if queued and service.role == "api":
            if database:
                problems.extend(self._workers())
        else:
            try:
                service.backend.check_available()
            except SandboxError as exc:
                problems.append(f"the sandbox cannot start: {exc}")
        return Readiness(
            ready=not problems,
            problems=problems,
            sandbox=service.backend.name,
            sandbox_mode=sandbox_mode(service.backend),
        )

    def _workers(self) -> list[str]:
        from safeaccess.server.store.queue_admin import newest_heartbeat_age

        lease = self.service.config.queue.lease_seconds
        try:
            age = newest_heartbeat_age(self.service.store)
        except Exception as exc:
            return [f"the job queue cannot be read: {str(exc).strip().splitlines()[0]}"]
        if age is None:
            return ["no worker is registered with the job queue"]
        if age > lease:
            return [f"no worker has sent a heartbeat for {age:.0f} s (lease {lease:g} s)"]
        return []
