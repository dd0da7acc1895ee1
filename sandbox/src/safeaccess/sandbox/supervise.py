"""Supervising a running job from the host: one bounded reader, one stderr tail, one set of limits.

Every backend hands a job its request and reads its reply the same way: chunk by chunk until the
stream ends (or the backend's framing says the reply is complete), stopping the job the moment
its wall clock runs out or its output passes its cap. The process backend reads a pipe and the
Docker backend the engine's multiplexed attach stream, with `read_until` and `read_reply` here;
the fork server, on a step's path, serves its socket to the job and the job's stderr on one
thread with `exchange` (the same cap and wall clock). All keep the tail of the job's stderr in a
`StderrTail` and report a limit with the one `LimitExceeded` message of that limit
(`limit_exceeded`).

How a job *ended* (reaping a process, a fork server's exit report, a container's state) stays
with each backend; `JobOutcome` is the host's record of it that the process backends share.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Literal

from safeaccess.sandbox.backend import STDERR_KEEP, LimitExceeded, Limits

READ_CHUNK = 65536
# How often a read loop wakes without data, so that a passed deadline is noticed promptly.
POLL_SECONDS = 1.0

Limit = Literal["cpu", "memory", "wall", "processes", "output", "file"]


def limit_exceeded(limit: Limit, limits: Limits) -> LimitExceeded:
    """The error for a job that hit `limit`: the same message whichever backend ran it.

    The message reaches the researcher (or, for a data-dependent failure, the output checker):
    it names the limit and its configured value, never anything the job computed.
    """
    if limit == "wall":
        return LimitExceeded(
            "wall",
            f"the job ran longer than its wall-clock limit of {limits.wall_seconds:g} s "
            "and was stopped",
        )
    if limit == "output":
        return output_exceeded(limits.max_output_bytes)
    if limit == "cpu":
        return LimitExceeded(
            "cpu", f"the job used more than its CPU limit of {limits.cpu_seconds} s"
        )
    if limit == "memory":
        return LimitExceeded(
            "memory", f"the job exceeded its memory limit of {limits.memory_mb} MB"
        )
    if limit == "processes":
        return LimitExceeded(
            "processes", f"the job exceeded its limit of {limits.max_processes} processes"
        )
    # A file in the job's private /tmp over RLIMIT_FSIZE: reported as an output limit.
    return LimitExceeded(
        "output", f"the job wrote a file larger than its limit of {limits.tmp_mb} MB"
    )


def output_exceeded(cap: int) -> LimitExceeded:
    """The output limit's error (`limit_exceeded("output", ...)`) for a cap of `cap` bytes."""
    return LimitExceeded(
        "output", f"the job's output exceeded its limit of {cap} bytes and was stopped"
    )


class StderrTail:
    """The last `STDERR_KEEP` bytes a job wrote to its stderr (for the controller's log only:
    a job's stderr can quote data values, so it never reaches a researcher).

    The tail, not the head: a crash's cause (a `MemoryError`, a signal) is written last, after
    whatever the job printed before it. With `fd`, a daemon thread drains that pipe (a job that
    fills a pipe nobody reads would block); otherwise the owner `add`s chunks itself.
    """

    def __init__(self, fd: int | None = None):
        self._kept = bytearray()
        self._thread: threading.Thread | None = None
        if fd is not None:
            self._thread = threading.Thread(
                target=self._drain, args=(fd,), name="job-stderr", daemon=True
            )
            self._thread.start()

    def add(self, chunk: bytes) -> None:
        """Keep `chunk`, dropping what falls out of the tail."""
        self._kept += chunk
        if len(self._kept) > STDERR_KEEP:
            del self._kept[: len(self._kept) - STDERR_KEEP]

    def _drain(self, fd: int) -> None:
        # The pipe belongs to the caller's process object, which closes it.
        try:
            for chunk in iter(lambda: os.read(fd, READ_CHUNK), b""):
                self.add(chunk)
        except OSError:
            pass  # the pipe was closed under us: what was read is the tail

    def finish(self, timeout: float = 2.0) -> bytes:
        """The tail, once the writer has closed its end (or after `timeout` seconds)."""
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        return bytes(self._kept)

    @property
    def value(self) -> bytes:
        """The tail as it stands now."""
        return bytes(self._kept)


def read_until(
    stream: int,
    read: Callable[[int], bytes],
    deadline: float,
    take: Callable[[bytes], bool],
) -> bool:
    """Read from `stream` (a selectable descriptor) into `take` until it says the reply is
    complete (True) or the stream ends (False).

    `read(n)` reads at most n bytes (`os.read` on a pipe, `recv` on a socket). `take` may raise
    (an output cap): the error propagates and the caller stops the job. Raise TimeoutError once
    `deadline` (a `time.monotonic()` value) has passed. A read error (a reset connection, a
    closed pipe) is an end of stream: the job is gone, and how it ended (its wait status, its
    container's state) says why; raising here would leave it unreaped.
    """
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if not selector.select(timeout=min(remaining, POLL_SECONDS)):
                continue
            try:
                chunk = read(READ_CHUNK)
            except (InterruptedError, BlockingIOError):
                continue
            except TimeoutError:
                raise  # a socket's own timeout: set to the deadline by its owner
            except OSError:
                return False  # reset or closed under us: the job is gone
            if not chunk:
                return False
            if take(chunk):
                return True


class OutputCap:
    """Collects a job's reply, raising the output limit as soon as it passes `limits`' cap."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self._chunks: list[bytes] = []
        self.size = 0

    def take(self, chunk: bytes) -> bool:
        """Add `chunk`; never complete by itself (the stream's end is)."""
        self.size += len(chunk)
        if self.size > self.limits.max_output_bytes:
            raise output_exceeded(self.limits.max_output_bytes)
        self._chunks.append(chunk)
        return False

    def data(self) -> bytes:
        """What was read within the cap."""
        return b"".join(self._chunks)


def read_reply(
    stream: int,
    read: Callable[[int], bytes],
    deadline: float,
    limits: Limits,
    stop: Callable[[], None],
) -> tuple[bytes, LimitExceeded | None]:
    """A job's whole reply read from `stream` within its wall clock and output cap.

    Returns (reply, None), or (what was read, the limit) after calling `stop()` to kill the job.
    """
    cap = OutputCap(limits)
    try:
        read_until(stream, read, deadline, cap.take)
    except TimeoutError:
        stop()
        return cap.data(), limit_exceeded("wall", limits)
    except LimitExceeded as exc:
        stop()
        return cap.data(), exc
    return cap.data(), None


def exchange(
    channel: socket.socket,
    request: bytes,
    stderr: int,
    tail: StderrTail,
    deadline: float,
    limits: Limits,
    stop: Callable[[], None],
) -> tuple[bytes, LimitExceeded | None]:
    """`read_reply` on a socket to the job that also writes it `request` (then half-closes)
    and keeps its `stderr` pipe's tail in `tail`, all on this thread: one selector over both
    descriptors, where `feed` and a draining `StderrTail` start two threads per job (about
    0.15 ms of CPU together, measured, on a step's path of a few milliseconds).

    Either may block the job if nobody serves it (a request it has not read yet, a stderr pipe
    it filled), so each is served as soon as it is ready. Returns when the reply ends; what
    the job writes to stderr after that is `drain`'s. A job that has gone away is no error
    here, as in `feed`: its end is reported by the reader and the reaper."""
    cap = OutputCap(limits)
    pending = memoryview(request)
    channel.setblocking(False)
    os.set_blocking(stderr, False)
    with selectors.DefaultSelector() as selector:
        if pending:
            selector.register(channel, selectors.EVENT_READ | selectors.EVENT_WRITE)
        else:
            channel.shutdown(socket.SHUT_WR)
            selector.register(channel, selectors.EVENT_READ)
        selector.register(stderr, selectors.EVENT_READ)
        stderr_open = True
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    stop()
                    return cap.data(), limit_exceeded("wall", limits)
                for key, events in selector.select(timeout=min(remaining, POLL_SECONDS)):
                    if key.fd == stderr:
                        if not _read_tail(stderr, tail):
                            selector.unregister(stderr)
                            stderr_open = False
                        continue
                    if events & selectors.EVENT_WRITE and pending:
                        pending = _send_some(channel, pending)
                        if not pending:
                            with contextlib.suppress(OSError):
                                channel.shutdown(socket.SHUT_WR)
                            selector.modify(channel, selectors.EVENT_READ)
                    if events & selectors.EVENT_READ and not _take_some(channel, cap):
                        return cap.data(), None
        except LimitExceeded as exc:
            stop()
            return cap.data(), exc
        finally:
            if stderr_open:
                os.set_blocking(stderr, True)


def drain(stderr: int, tail: StderrTail, deadline: float) -> None:
    """Keep the rest of a job's `stderr` in `tail` until the pipe ends (the job has exited:
    every copy of its write end is the job's) or `deadline` passes."""
    with selectors.DefaultSelector() as selector:
        selector.register(stderr, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0:
            if selector.select(timeout=min(remaining, POLL_SECONDS)) and not _read_tail(
                stderr, tail
            ):
                return


def _read_tail(fd: int, tail: StderrTail) -> bool:
    """Read what `fd` has into `tail`; False at its end (or a read error: the same to us)."""
    try:
        chunk = os.read(fd, READ_CHUNK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    tail.add(chunk)
    return bool(chunk)


def _send_some(channel: socket.socket, pending: memoryview) -> memoryview:
    """Send what the socket takes of `pending`; the rest (empty once sent, or once the job
    has gone: nothing more can reach it)."""
    try:
        return pending[channel.send(pending) :]
    except (BlockingIOError, InterruptedError):
        return pending
    except OSError:
        return pending[:0]


def _take_some(channel: socket.socket, cap: OutputCap) -> bool:
    """Read what the socket has into `cap`; False at the reply's end (a reset or closed
    socket included: the job is gone, and how it ended says why)."""
    try:
        chunk = channel.recv(READ_CHUNK)
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False
    if not chunk:
        return False
    cap.take(chunk)
    return True


def feed(
    write: Callable[[bytes], object], payload: bytes, done: Callable[[], None]
) -> threading.Thread:
    """Write `payload` then call `done` (close or half-close), on a daemon thread.

    A thread, because a job that never reads its request would otherwise block the host's
    writer while the reader waits for a reply. A job that has gone away is no error here: its
    end is reported by the reader and the reaper.
    """

    def run() -> None:
        with contextlib.suppress(OSError):
            write(payload)
        with contextlib.suppress(OSError):
            done()

    thread = threading.Thread(target=run, name="job-request", daemon=True)
    thread.start()
    return thread


class JobOutcome:
    """How one process-backend job ended, as seen from the host (one-shot and fork server)."""

    def __init__(self) -> None:
        self.stdout = b""
        self.stderr = b""
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.cpu_seconds = 0.0
        self.killed_for: LimitExceeded | None = None
        # The job's peak resident memory where it is measured (a fork server job's own
        # rusage, which its template reports); for benchmarks, never shown to researchers.
        self.peak_rss_bytes: int | None = None

    def set_status(self, status: int, cpu_seconds: float) -> None:
        """Record a wait status (`os.wait4`'s) and the CPU seconds the job used."""
        self.cpu_seconds = cpu_seconds
        if os.WIFSIGNALED(status):
            self.signal = os.WTERMSIG(status)
            return
        code = os.WEXITSTATUS(status)
        self.exit_code = code
        # bubblewrap and the fork server's job reaper report a child killed by signal N as
        # exit status 128 + N.
        if code > 128:
            self.signal = code - 128
