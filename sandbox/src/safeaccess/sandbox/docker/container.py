"""One hardened job container: how it is created, fed its request and read back, with limits.

Every container gets: no network, a read-only root file system, all capabilities dropped,
no-new-privileges, an unprivileged user, a pids limit, memory == memory+swap (no swap), a CPU
quota, an RLIMIT_CPU, a size-capped noexec tmpfs on /tmp, an init process (reaps zombies and
forwards signals), no IPC namespace sharing, a capped json-file log, and exactly one host path:
the job's dataset file, bind-mounted read-only at `/data/dataset.parquet`.

I/O: the container runs `safeaccess.sandbox.docker.entry` with stdin open. The backend attaches
to the container (stdin + stdout + stderr), sends one length-prefixed `RunnerRequest` and reads the
multiplexed output stream, counting stdout bytes against the output limit and killing the
container the moment it is exceeded or the wall clock runs out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import LogConfig, Mount, Ulimit

from safeaccess.sandbox.backend import (
    DATASET_PATH,
    AnalysisFailed,
    JobCrashed,
    LimitExceeded,
    Limits,
    RunnerResponse,
    SandboxError,
    decode_reply,
)
from safeaccess.sandbox.docker.entry import DONE_MARKER, ENV_PRELOAD, READY_MARKER
from safeaccess.sandbox.docker.image import SANDBOX_TMP, SANDBOX_USER
from safeaccess.sandbox.seccomp import docker_profile
from safeaccess.sandbox.supervise import StderrTail, limit_exceeded, output_exceeded, read_until

log = logging.getLogger(__name__)

LABEL_ROLE = "org.safeaccess.sandbox.role"
LABEL_OWNER = "org.safeaccess.sandbox.owner"
LOG_MAX_SIZE = "1m"
SIGXCPU_EXIT = 128 + 24
SIGKILL_EXIT = 128 + 9
SECCOMP_PROFILE = json.dumps(docker_profile(), separators=(",", ":"))


@dataclass(frozen=True)
class DatasetKey:
    """A dataset file by identity: a replaced file (new inode or mtime) is a different key."""

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    gid: int
    world_readable: bool
    group_readable: bool

    @classmethod
    def of(cls, dataset: Path) -> DatasetKey:
        """Identify the dataset file, or raise SandboxError if it is not a readable regular file."""
        path = Path(dataset).resolve()
        try:
            st = path.stat()
        except OSError as exc:
            raise SandboxError(f"dataset file {dataset} cannot be read: {exc.strerror}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise SandboxError(f"dataset {dataset} is not a regular file")
        return cls(
            path=str(path),
            device=st.st_dev,
            inode=st.st_ino,
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
            gid=st.st_gid,
            world_readable=bool(st.st_mode & stat.S_IROTH),
            group_readable=bool(st.st_mode & stat.S_IRGRP),
        )

    def sandbox_groups(self) -> list[int]:
        """Supplementary group the sandbox user needs to read the file, if any.

        The server stores datasets group-readable (0440), so the unprivileged sandbox user gets
        the file's group as a supplementary group. That may be group 0 when the server runs as
        root: inside the container it confers nothing else (no capabilities, read-only root file
        system whose files are all world-readable anyway, a private /tmp), which is the same
        arbitrary-uid + gid-0 arrangement OpenShift uses for its pods.
        """
        if self.world_readable:
            return []
        if self.group_readable:
            return [self.gid]
        raise SandboxError(
            f"dataset {self.path} is readable by its owner only, so the unprivileged sandbox user "
            "cannot read it: make it group-readable (chmod g+r, as the server stores datasets)"
        )


def container_kwargs(
    *,
    image: str,
    dataset: DatasetKey,
    limits: Limits,
    cpus: float,
    labels: dict[str, str],
    name: str,
    preload: bool = True,
) -> dict[str, Any]:
    """Arguments for `client.containers.create` of one hardened job container.

    `preload` (for warm-pool containers) makes the entry point import the analysis libraries
    before it reports ready; a container started for a waiting job skips that.
    """
    threads = str(max(1, int(cpus)))
    memory = f"{limits.memory_mb}m"
    return {
        "image": image,
        "name": name,
        "detach": True,
        "stdin_open": True,
        "tty": False,
        "hostname": "sandbox",
        "user": SANDBOX_USER,
        "group_add": [str(g) for g in dataset.sandbox_groups()],
        "working_dir": SANDBOX_TMP,
        "environment": {
            # Thread pools sized to the CPU quota, not to the host's cores.
            "OMP_NUM_THREADS": threads,
            "OPENBLAS_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            ENV_PRELOAD: "1" if preload else "0",
        },
        "network_mode": "none",
        "read_only": True,
        "cap_drop": ["ALL"],
        # Our own deny-by-default allow-list instead of the engine's default profile: the same
        # list the process backend installs (safeaccess.sandbox.seccomp).
        "security_opt": ["no-new-privileges", f"seccomp={SECCOMP_PROFILE}"],
        "privileged": False,
        "init": True,
        "ipc_mode": "none",
        "pids_limit": limits.max_processes + 1,  # +1 for the init process
        "mem_limit": memory,
        "memswap_limit": memory,
        "nano_cpus": int(cpus * 1_000_000_000),
        "ulimits": [
            Ulimit(name="cpu", soft=limits.cpu_seconds, hard=limits.cpu_seconds + 1),
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="nofile", soft=1024, hard=1024),
        ],
        "tmpfs": {SANDBOX_TMP: f"rw,noexec,nosuid,nodev,size={limits.tmp_mb}m,mode=1777"},
        "mounts": [
            Mount(
                target=DATASET_PATH,
                source=dataset.path,
                type="bind",
                read_only=True,
                propagation="rprivate",
            )
        ],
        "log_config": LogConfig(
            type=LogConfig.types.JSON, config={"max-size": LOG_MAX_SIZE, "max-file": "1"}
        ),
        "labels": labels,
    }


def _raw_socket(sock: Any) -> socket.socket:
    raw = getattr(sock, "_sock", sock)
    if not isinstance(raw, socket.socket):
        raise SandboxError("the Docker Engine connection does not expose a socket for attach")
    return raw


class _Demux:
    """Parse Docker's multiplexed attach stream (8-byte header: stream id, 3 zero bytes, size).

    Stdout is counted against the output cap `max_stdout` as it arrives; stderr goes to a
    `StderrTail`.
    """

    def __init__(self, max_stdout: int, tail: StderrTail | None = None):
        self.max_stdout = max_stdout
        self.stdout = bytearray()
        self.tail = tail if tail is not None else StderrTail()
        self._buffer = bytearray()

    @property
    def stderr_tail(self) -> bytes:
        """The end of the container's stderr so far."""
        return self.tail.value

    def feed(self, data: bytes) -> None:
        """Take a chunk of the stream; raise the output limit once stdout passes the cap."""
        self._buffer += data
        while len(self._buffer) >= 8:
            kind = self._buffer[0]
            size = int.from_bytes(self._buffer[4:8], "big")
            if len(self._buffer) < 8 + size and kind == 1:
                # Count stdout as it arrives so a flood is stopped before it is buffered whole.
                if len(self.stdout) + len(self._buffer) - 8 > self.max_stdout:
                    raise output_exceeded(self.max_stdout)
                return
            if len(self._buffer) < 8 + size:
                return
            payload = bytes(self._buffer[8 : 8 + size])
            del self._buffer[: 8 + size]
            if kind == 1:
                self.stdout += payload
                if len(self.stdout) > self.max_stdout:
                    raise output_exceeded(self.max_stdout)
            elif kind == 2:
                self.tail.add(payload)

    def pending(self) -> bytearray:
        """Bytes received after the complete frames consumed so far (the start of the next)."""
        return bytearray(self._buffer)


def _kill(container: Container) -> None:
    with contextlib.suppress(docker.errors.APIError):  # already exited
        container.kill()


class JobContainer:
    """A started job container with its attach stream open, ready to take exactly one request."""

    def __init__(self, container: Container, api: Any):
        self.container = container
        self._api = api
        self._sock: Any = None
        self._raw: socket.socket | None = None
        self._buffer = bytearray()
        self._stderr = StderrTail()

    def start(self, timeout: float) -> None:
        """Attach to stdin/stdout/stderr, start the container, wait until it reports ready.

        Attaching comes first (as `docker start --attach` does): an attach stream only carries
        output written after it was opened, and the ready marker can be written within
        milliseconds of the start.
        """
        try:
            self._sock = self._api.attach_socket(
                self.container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
        except docker.errors.APIError as exc:
            raise SandboxError(f"could not attach to the sandbox container: {exc}") from exc
        self._raw = _raw_socket(self._sock)
        self.container.start()
        # Only the ready marker may come before the request: a cap of its length.
        demux = _Demux(len(READY_MARKER), self._stderr)
        deadline = time.monotonic() + timeout
        try:
            if not self._read(demux, deadline, lambda: demux.stdout.startswith(READY_MARKER)):
                raise SandboxError(
                    "the sandbox container stopped while starting; the controller's log has "
                    "its error output"
                )
        except LimitExceeded:
            raise SandboxError(
                "the sandbox container wrote unexpected output while starting"
            ) from None
        except TimeoutError:
            raise SandboxError(
                f"the sandbox container was not ready within {timeout:g} s of starting"
            ) from None
        self._buffer = demux.pending()

    def _read(self, demux: _Demux, deadline: float, complete: Callable[[], bool]) -> bool:
        """Read into `demux` until `complete()` (True) or the stream ends (False); TimeoutError
        past the deadline, the output limit from `demux`."""
        raw = self._raw
        assert raw is not None

        def take(chunk: bytes) -> bool:
            demux.feed(chunk)
            return complete()

        return complete() or read_until(raw.fileno(), raw.recv, deadline, take)

    def run(self, request: bytes, limits: Limits, started: float) -> RunnerResponse:
        """Send `request` and return the runner's response (see `execute`)."""
        assert self._raw is not None
        deadline = started + limits.wall_seconds
        demux = _Demux(limits.max_output_bytes, self._stderr)
        demux.feed(bytes(self._buffer))
        try:
            self._raw.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                self._raw.sendall(len(request).to_bytes(8, "big") + request)
            except TimeoutError:
                self.stop_now()
                raise limit_exceeded("wall", limits) from None
            except OSError as exc:
                raise SandboxError(
                    f"the sandbox container stopped before taking its job: {exc}"
                ) from exc
            try:
                self._read(demux, deadline, lambda: demux.stdout.endswith(DONE_MARKER))
            except TimeoutError:
                self.stop_now()
                raise limit_exceeded("wall", limits) from None
            except LimitExceeded:
                self.stop_now()
                raise
        finally:
            self.close()
        if demux.stdout.endswith(DONE_MARKER):
            del demux.stdout[-len(DONE_MARKER) :]
            response = _parse(demux.stdout)
            if response is not None and response.ok and response.output is not None:
                return response  # complete: no need to wait for the container to exit
        return _finish(self.container, demux, limits, deadline)

    def stop_now(self) -> None:
        # Close our end of the attach stream first: the engine may be blocked writing a flood of
        # output to it, and would not finish the kill until that write fails.
        self.close()
        _kill(self.container)

    def interrupt(self) -> None:
        """Stop the job from another thread (a stopping worker's `abandon`): shut the attach
        stream down, which wakes the thread reading it (closing the descriptor would not: the
        selector just forgets it, and the reader would wait out the wall-clock limit), then kill
        the container. The reading thread closes the stream itself."""
        raw = self._raw
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)
        _kill(self.container)

    def close(self) -> None:
        """Close the attach stream (the container itself is removed by the backend)."""
        for handle in (self._raw, self._sock):
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()
        self._raw = None
        self._sock = None


def _parse(stdout: bytearray) -> RunnerResponse | None:
    if not stdout:
        return None
    reply = decode_reply(bytes(stdout))
    return reply.response if reply is not None else None


def _finish(container: Container, demux: _Demux, limits: Limits, deadline: float) -> RunnerResponse:
    try:
        status = container.wait(timeout=max(1.0, deadline - time.monotonic()))
    except Exception:  # the engine's read timeout surfaces as a requests/urllib3 error
        _kill(container)
        raise limit_exceeded("wall", limits) from None
    exit_code = int(status.get("StatusCode", -1))
    container.reload()
    state = container.attrs.get("State", {})
    response = _parse(demux.stdout)
    stderr = demux.stderr_tail
    if stderr:
        log.debug(
            "sandbox container %s stderr (tail): %s",
            container.short_id,
            stderr.decode("utf-8", "replace"),
        )
    if response is not None and response.ok and response.output is not None:
        return response
    if state.get("OOMKilled"):
        raise limit_exceeded("memory", limits)
    if exit_code in (SIGXCPU_EXIT, SIGKILL_EXIT) and response is None:
        # SIGXCPU is the soft RLIMIT_CPU; SIGKILL the hard one (for a job that ignores SIGXCPU).
        # The only other senders of SIGKILL are the kernel's OOM killer (flagged above) and this
        # backend's own wall-clock kill (reported before we get here).
        raise limit_exceeded("cpu", limits)
    if response is not None and response.error is not None:
        code = response.error.code
        if code == "limit_memory":
            raise limit_exceeded("memory", limits)
        if code == "limit_processes":
            raise limit_exceeded("processes", limits)
        raise AnalysisFailed(code, response.error.message)
    # The runner's stderr can carry data values: keep it in the controller's log, not the message.
    raise JobCrashed(
        f"the analysis process ended (exit status {exit_code}) without a valid result; "
        "the controller's log has the details"
    )


def owner_label() -> str:
    """Who started a container: host, process id and a per-backend token (to reap orphans)."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:12]}"
