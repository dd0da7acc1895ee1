"""The host side of the process backend's fork server: templates, one per dataset version.

A `TemplateProcess` is one bubblewrap sandbox running `safeaccess.sandbox.process.template` for one
(dataset file version, runner version) key; `ForkServer` keeps the templates of the most
recently used keys and runs each job in a child forked from the right one. See the template and
`safeaccess.sandbox.process.isolate` for what happens inside; docs/sandbox.md for the design.

Lifecycle of a template: STARTING (bubblewrap started, libraries importing, dataset loading) ->
READY (serving jobs) -> RETIRED (replaced: new dataset version or runner, or evicted; it
finishes the jobs it has and is closed) or DAMAGED (died, closed its control socket, sent
something unexpected, failed to report a job's end: it is killed at once and never reused).
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from safeaccess.sandbox.backend import (
    CODES_PATH,
    DATASET_PATH,
    MAX_MESSAGE,
    Limits,
    SandboxUnavailable,
)
from safeaccess.sandbox.process.template import ENV_CODES, ENV_DATASET, ENV_FAMILY
from safeaccess.sandbox.supervise import JobOutcome, StderrTail, drain, exchange

log = logging.getLogger(__name__)

READY_SECONDS = 120.0
# After the job channel closed, how long the template may take to report the job's end.
EXIT_REPORT_SECONDS = 10.0


class TemplateState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    RETIRED = "retired"
    DAMAGED = "damaged"


class TemplateDamaged(Exception):
    """The template died or misbehaved; the job it was serving has no trustworthy outcome."""


class _Pending:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.status: int | None = None
        self.cpu = 0.0
        self.maxrss: int | None = None


class TemplateProcess:
    """One running template and its control socket."""

    def __init__(self, command: list[str], preexec: Callable[[], None], family: str = "full"):
        self.state = TemplateState.STARTING
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._counter = 0
        self.active = 0
        host, inside = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._control = host
        env = {
            "SAFEACCESS_TEMPLATE_FD": str(inside.fileno()),
            ENV_FAMILY: family,
            ENV_DATASET: DATASET_PATH,
            ENV_CODES: CODES_PATH,
        }
        at = command.index("--")
        setenv = [a for key, value in env.items() for a in ("--setenv", key, value)]
        try:
            self.proc = subprocess.Popen(  # fixed argv, no shell
                [*command[:at], *setenv, *command[at:]],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=preexec,
                pass_fds=(inside.fileno(),),
            )
        except OSError as exc:
            host.close()
            raise SandboxUnavailable(f"the sandbox template could not be started: {exc}") from exc
        finally:
            inside.close()
        self.born = time.monotonic()
        assert self.proc.stderr is not None
        self._stderr = StderrTail(self.proc.stderr.fileno())
        self._ready = threading.Event()
        threading.Thread(target=self._listen, name="template-control", daemon=True).start()

    # -- lifecycle ---------------------------------------------------------------------------

    def wait_ready(self, timeout: float = READY_SECONDS) -> None:
        if not self._ready.wait(timeout) or self.state is not TemplateState.READY:
            reason = self._stderr.value.decode("utf-8", "replace").strip()[-500:]
            self.damage()
            raise SandboxUnavailable(
                "the sandbox template did not start"
                + (f": {reason}" if reason else f" within {timeout:g} s")
            )

    def damage(self) -> None:
        """Kill the template (and with it every job it forked); it is never used again."""
        with self._lock:
            if self.state is not TemplateState.DAMAGED:
                self.state = TemplateState.DAMAGED
        self._stop()

    def retire(self) -> None:
        """No new jobs; close once the jobs it is running are done."""
        with self._lock:
            if self.state in (TemplateState.STARTING, TemplateState.READY):
                self.state = TemplateState.RETIRED
            idle = self.active == 0
        if idle:
            self._stop()

    def _stop(self) -> None:
        with contextlib.suppress(OSError):
            self._control.shutdown(socket.SHUT_RDWR)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
            self.proc.wait(timeout=5)
        with self._lock:
            pending = list(self._pending.values())
        for waiting in pending:
            waiting.done.set()

    @property
    def usable(self) -> bool:
        return self.state is TemplateState.READY and self.proc.poll() is None

    @property
    def stderr_tail(self) -> bytes:
        """The end of what the template wrote to its stderr (why it failed to start, say)."""
        return self._stderr.value

    def _listen(self) -> None:
        """Read the template's messages until its control socket closes."""
        while True:
            try:
                data = self._control.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            try:
                message = json.loads(data)
                op = message["op"]
                if op == "ready" and self.state is TemplateState.STARTING:
                    with self._lock:
                        self.state = TemplateState.READY
                    self._ready.set()
                elif op == "exit":
                    with self._lock:
                        waiting = self._pending.get(str(message["job"]))
                    if waiting is None:
                        raise ValueError("exit of an unknown job")
                    waiting.status = int(message["status"])
                    waiting.cpu = float(message["cpu"])
                    if "maxrss" in message:
                        waiting.maxrss = int(message["maxrss"]) * 1024
                    waiting.done.set()
                else:
                    raise ValueError(f"unexpected message {op!r}")
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("sandbox template sent a bad message (%s); replacing it", exc)
                break
        # Closed or misbehaving: whatever it was doing can no longer be trusted.
        self.damage()
        self._ready.set()

    # -- jobs --------------------------------------------------------------------------------

    def run(self, request: bytes, uid: int, limits: Limits) -> JobOutcome:
        """Run one job in a fresh child of this template; raise TemplateDamaged if it broke."""
        with self._lock:
            if self.state is not TemplateState.READY:
                raise TemplateDamaged("the template is not serving")
            self._counter += 1
            job = str(self._counter)
            waiting = self._pending[job] = _Pending()
            self.active += 1
        channel, child_channel = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        err_read, err_write = os.pipe()
        outcome = JobOutcome()
        try:
            try:
                with self._send_lock:
                    socket.send_fds(
                        self._control,
                        [self._run_message(job, uid, limits)],
                        [child_channel.fileno(), err_write],
                    )
            except OSError as exc:
                os.close(err_read)
                self.damage()
                raise TemplateDamaged(f"the template stopped accepting jobs: {exc}") from exc
            finally:
                child_channel.close()
                os.close(err_write)
            stderr = StderrTail()
            deadline = time.monotonic() + limits.wall_seconds
            try:
                outcome.stdout, outcome.killed_for = exchange(
                    channel, request, err_read, stderr, deadline, limits, lambda: self._kill(job)
                )
                # Its end comes with the job's exit (the job's pid namespace dies with it).
                drain(err_read, stderr, max(deadline, time.monotonic()) + EXIT_REPORT_SECONDS)
            finally:
                os.close(err_read)
            if not waiting.done.wait(max(deadline - time.monotonic(), 0) + EXIT_REPORT_SECONDS):
                self._kill(job)
                if not waiting.done.wait(EXIT_REPORT_SECONDS):
                    self.damage()
                    raise TemplateDamaged("the template did not report the end of a job")
            if waiting.status is None:
                raise TemplateDamaged("the template ended while running the job")
            outcome.stderr = stderr.value
            outcome.set_status(waiting.status, waiting.cpu)
            outcome.peak_rss_bytes = waiting.maxrss
            return outcome
        finally:
            channel.close()
            with self._lock:
                self._pending.pop(job, None)
                self.active -= 1
                finished = self.state is TemplateState.RETIRED and self.active == 0
            if finished:
                self._stop()

    @staticmethod
    def _run_message(job: str, uid: int, limits: Limits) -> bytes:
        # Limits travel with each job (the job applies them to itself): one template serves
        # jobs of any limits on its dataset.
        message = {"op": "run", "job": job, "uid": uid, "limits": limits.model_dump(mode="json")}
        return json.dumps(message).encode()

    def _kill(self, job: str) -> None:
        try:
            with self._send_lock:
                self._control.send(json.dumps({"op": "kill", "job": job}).encode())
        except OSError:
            self.damage()


TemplateKey = tuple[object, ...]


class ForkServer:
    """Templates for the `max_templates` most recently used keys, started on first use."""

    def __init__(
        self,
        start: Callable[[TemplateKey, Path], TemplateProcess],
        max_templates: int = 4,
    ):
        self._start = start
        self.max_templates = max(1, max_templates)
        self._templates: OrderedDict[TemplateKey, TemplateProcess] = OrderedDict()
        self._starting: dict[TemplateKey, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = False

    def template(self, key: TemplateKey, dataset: Path) -> TemplateProcess:
        """The ready template for `key`, started (once, even under concurrent calls) if needed."""
        with self._lock:
            if self._closed:
                raise SandboxUnavailable("the sandbox backend is closed")
            start_lock = self._starting.setdefault(key, threading.Lock())
        with start_lock:
            with self._lock:
                found = self._templates.get(key)
                if found is not None and found.usable:
                    self._templates.move_to_end(key)
                    return found
                if found is not None:
                    del self._templates[key]
            if found is not None:
                found.damage()
            fresh = self._start(key, dataset)
            fresh.wait_ready()
            evicted: list[TemplateProcess] = []
            with self._lock:
                if self._closed:
                    evicted.append(fresh)
                else:
                    self._templates[key] = fresh
                    self._templates.move_to_end(key)
                    while len(self._templates) > self.max_templates:
                        evicted.append(self._templates.popitem(last=False)[1])
            for old in evicted:
                old.retire()
            if self._closed:
                raise SandboxUnavailable("the sandbox backend is closed")
            return fresh

    def retire_stale(self, key: TemplateKey, same_version: Callable[[TemplateKey], bool]) -> None:
        """Retire the templates for which `same_version(their key)` is false: another version of
        the dataset file (replaced data) or of the runner."""
        with self._lock:
            stale = [k for k in self._templates if k != key and not same_version(k)]
            retired = [self._templates.pop(k) for k in stale]
        for template in retired:
            template.retire()

    def templates(self) -> list[TemplateProcess]:
        with self._lock:
            return list(self._templates.values())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            templates = list(self._templates.values())
            self._templates.clear()
        for template in templates:
            template.damage()
