"""The fork server's template: `python -m safeaccess.sandbox.process.template` inside bubblewrap.

One template runs per dataset version. It imports the runner and its libraries, loads
the dataset from /data once (decoded into a DataFrame once: every job forked from the template
shares those pages copy-on-write) and memory-maps its code arrays, when the version has them, then serves the host over one control socket. It never runs
researcher input itself: for each job it forks a child that isolates itself
(`safeaccess.sandbox.process.isolate`) and only then reads the request.

Control protocol (SOCK_SEQPACKET, one JSON object per message, little and fixed):

- host -> template `{"op": "run", "job": id, "uid": n, "limits": {...}}` with two descriptors attached: the job
  channel (a stream socket: request in, reply out) and the write end of the job's stderr pipe;
- host -> template `{"op": "kill", "job": id}`: kill that job (wall clock or output cap);
- template -> host `{"op": "ready", "threads": n}` once loaded, then
  `{"op": "exit", "job": id, "status": wait_status, "cpu": seconds}` when a job has ended.

The template exits when the control socket closes (its host is gone or replaced it); bubblewrap's
`--die-with-parent` and the children's parent-death signals take everything else down with it.

This module runs inside the sandbox only; it imports nothing from the host side.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from safeaccess.sandbox.backend import Limits

ENV_CONTROL_FD = "SAFEACCESS_TEMPLATE_FD"
ENV_FAMILY = "SAFEACCESS_TEMPLATE_FAMILY"
# Where the host bound the dataset (backend.DATASET_PATH): passed in, because this module may
# import nothing of ours before the template has left the host's privileges.
ENV_DATASET = "SAFEACCESS_TEMPLATE_DATASET"
# Where the host bound the version's code arrays (backend.CODES_PATH), if it has them.
ENV_CODES = "SAFEACCESS_TEMPLATE_CODES"
# Imported by every template beside its family's modules (runner/kinds.py): what a job runs to
# isolate itself.
ISOLATION_MODULES = ("safeaccess.sandbox.process.isolate", "safeaccess.sandbox.seccomp")


def _send(control: socket.socket, message: dict[str, object]) -> None:
    control.send(json.dumps(message).encode("ascii"))


def _task_count() -> int:
    return len(os.listdir("/proc/self/task"))


class Template:
    """The serving loop: fork a child per job, report each child's end."""

    def __init__(self, control: socket.socket, dataset: object, program: bytes):
        from safeaccess.sandbox.backend import MAX_MESSAGE  # imported once the drop is done

        self.max_message = MAX_MESSAGE
        self.control = control
        self.program = program
        self.own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.dataset = dataset
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, tuple[str, int]] = {}  # pidfd -> (job id, pid)

    def serve(self) -> None:
        self.selector.register(self.control, selectors.EVENT_READ, None)
        while True:
            for key, _ in self.selector.select():
                if key.data is None:
                    if not self._control_message():
                        self._shutdown()
                        return
                else:
                    self._reap(key.fd)

    def _control_message(self) -> bool:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.control, self.max_message, 2)
        except OSError:
            return False
        if not data:
            for fd in fds:
                os.close(fd)
            return False
        try:
            message = json.loads(data)
            op = message["op"]
            if op == "run" and len(fds) == 2:
                from safeaccess.sandbox.backend import Limits  # imported once the drop is done

                limits = Limits.model_validate(message["limits"])
                self._fork_job(str(message["job"]), int(message["uid"]), limits, fds[0], fds[1])
            elif op == "kill":
                self._kill(str(message["job"]))
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return True

    def _fork_job(self, job: str, uid: int, limits: Limits, channel: int, stderr: int) -> None:
        from safeaccess.sandbox.process.isolate import new_pid_namespace, run_isolated_job

        new_pid_namespace(self.own_pid_namespace)
        pid = os.fork()
        if pid == 0:  # the job: never returns
            run_isolated_job(
                channel=channel,
                stderr=stderr,
                uid=uid,
                limits=limits,
                dataset=self.dataset,
                program=self.program,
            )
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (job, pid)
        self.selector.register(pidfd, selectors.EVENT_READ, "child")

    def _kill(self, job: str) -> None:
        for pidfd, (name, _pid) in self.children.items():
            if name == job:  # a pidfd names exactly this child, even if it has just exited
                try:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                except OSError as exc:  # the host then sees no exit report and replaces us
                    print(f"template: cannot kill job {job}: {exc}", file=sys.stderr)

    def _reap(self, pidfd: int) -> None:
        job, pid = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status, usage = os.wait4(pid, 0)
        _send(
            self.control,
            {
                "op": "exit",
                "job": job,
                "status": status,
                "cpu": usage.ru_utime + usage.ru_stime,
                "maxrss": usage.ru_maxrss,  # KiB: the job's peak resident memory
            },
        )

    def _shutdown(self) -> None:
        for pidfd in self.children:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def load_dataset(source: str | int, codes: dict[str, int] | None = None) -> object:
    """The dataset (a path, or an open descriptor, which is closed) as a DataFrame, decoded
    once, without starting a thread: the template must stay single-threaded so that forking it
    is safe (Arrow's memory mapping, pre-buffering and threaded decoding would each start a
    thread pool).

    With `codes` (the opened files of its code arrays, which are closed), a `LoadedDataset`:
    the frame and the arrays memory-mapped, after checking they were made from these very bytes.
    Arrays that fail the check are left out (the jobs then code the values themselves)."""
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(source, "rb") as fh:
        raw = fh.read()
    digest = hashlib.sha256(raw).hexdigest() if codes else ""
    table = pq.ParquetFile(pa.BufferReader(raw), pre_buffer=False).read(use_threads=False)
    del raw
    frame = table.to_pandas(use_threads=False)
    if not codes:
        return frame
    from safeaccess.sandbox.codes import CodesError, map_codes
    from safeaccess.sandbox.runner import LoadedDataset

    try:
        return LoadedDataset(frame, map_codes(codes, digest))
    except (CodesError, OSError) as exc:
        print(f"template: code arrays not used: {exc}", file=sys.stderr)
        return LoadedDataset(frame)


def _open_codes(directory: str | None) -> dict[str, int] | None:
    """The code array files, opened while the template still may (standard library only)."""
    if not directory or not os.path.isdir(directory):
        return None
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return {
            name: os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd)
            for name in os.listdir(fd)
            if not name.startswith(".")
        }
    finally:
        os.close(fd)


def main() -> None:
    control = socket.socket(fileno=int(os.environ.pop(ENV_CONTROL_FD)))
    # The dataset is root's: opened now, then the host's privileges are left (for a user
    # namespace of the template's own) before any library is imported or any byte of the
    # dataset parsed. The process that called main() waits in there; its child returns.
    data = os.open(os.environ.pop(ENV_DATASET), os.O_RDONLY | os.O_CLOEXEC)
    codes = _open_codes(os.environ.pop(ENV_CODES, None))
    from safeaccess.sandbox.process.template_privileges import enter_own_user_namespace

    enter_own_user_namespace()
    from safeaccess.sandbox.runner.kinds import Family, preload_modules

    named = os.environ.pop(ENV_FAMILY, "full")
    family: Family = "tables" if named == "tables" else "duckdb" if named == "duckdb" else "full"
    for name in (*preload_modules(family), *ISOLATION_MODULES):
        importlib.import_module(name)
    from safeaccess.sandbox import seccomp

    program = seccomp.compile_filter()
    # A storage "duckdb" dataset is never loaded: its jobs query the file through this
    # descriptor (runner/duckdb_source.py reads it with pread, so jobs share no offset).
    if family == "duckdb":
        for fd in (codes or {}).values():
            os.close(fd)  # code arrays serve loaded frames only
        dataset: object = data
    else:
        dataset = load_dataset(data, codes)
    # Objects that exist now are never collected: a collection in a job would otherwise write to
    # (and so copy) every shared page holding them.
    gc.collect()
    gc.freeze()
    threads = _task_count()
    if threads != 1:
        print(f"template: {threads} threads after loading; refusing to fork", file=sys.stderr)
        raise SystemExit(3)
    _send(control, {"op": "ready", "threads": threads})
    Template(control, dataset, program).serve()
    os._exit(0)


if __name__ == "__main__":
    main()
