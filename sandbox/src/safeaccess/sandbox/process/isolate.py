"""A fork server job isolating itself, then running exactly one job (inside the sandbox only).

Called in the child the template forked for a job, before it reads the request or touches the
data. In order:

1. it was forked as pid 1 of a new pid namespace (the template unshares one before each fork),
   so it sees no other process, not the template, not a sibling, and when it ends the kernel
   kills everything it started; parent-death signal (it dies if the template dies); every
   inherited descriptor is closed except the job channel and the job's stderr pipe;
2. `unshare` of mount, ipc, uts and network namespaces;
3. in the new mount namespace: a fresh /proc (of the job's pid namespace only) and a fresh,
   size-capped tmpfs on /tmp, invisible to every other job and empty;
4. stdin/stdout on /dev/null, stderr on the job's pipe, the job channel on fd 3, nothing else;
5. (an unprivileged server's job) a user namespace of its own, mapping its fresh uid to the
   service user's one id; then rlimits (memory and address space on top of what the job inherited from the template, CPU,
   file size, processes, no core dumps);
6. an empty capability bounding set and ambient set, then a fresh unprivileged uid/gid (no
   supplementary groups), which empties the permitted and effective sets, then an empty
   inheritable set: the job holds no capability and can never be granted one;
7. the seccomp allow-list (`safeaccess.sandbox.seccomp`).

Only then is the request read from the job channel and the reply written back through the
runner's `reply_for`, the function the one-shot runner uses.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import resource
import signal
import sys
from typing import NoReturn, Protocol

from safeaccess.sandbox.process.template_privileges import (
    JOB_UID_FIRST,
    TEMPLATE_UID,
    enter_own_user_namespace,
    map_one_id,
    set_capabilities,
)

CLONE_NEWNS = 0x0002_0000
CLONE_NEWUTS = 0x0400_0000
CLONE_NEWIPC = 0x0800_0000
CLONE_NEWPID = 0x2000_0000
CLONE_NEWUSER = 0x1000_0000
CLONE_NEWNET = 0x4000_0000
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
JOB_FD = 3
# A storage "duckdb" dataset's descriptor, which the template passes instead of a loaded frame.
DATASET_FD = 4
# Paths inside the sandbox, not on the host.
TMP = "/tmp"  # noqa: S108
ADDRESS_SPACE_HEADROOM = 512 * 1024 * 1024
MAX_REQUEST_BYTES = 16 * 1024 * 1024
# Exit statuses of a job that could not isolate itself (it then never ran the analysis).
EXIT_SETUP_FAILED = 71

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


# open_tree(2) / move_mount(2) (x86_64 numbers): carry a mount across the job's fresh /tmp.
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
OPEN_TREE_CLONE = 1
AT_RECURSIVE = 0x8000
AT_FDCWD = -100
MOVE_MOUNT_F_EMPTY_PATH = 4


def _mounts_under(root: str) -> list[str]:
    """The outermost mount points strictly below `root` (e.g. an installation bound under /tmp)."""
    points = []
    with open("/proc/self/mountinfo", "rb") as fh:
        for line in fh:
            point = line.split()[4].decode("utf-8", "surrogateescape")
            if point.startswith(root.rstrip("/") + "/"):
                points.append(point)
    points.sort()
    outer: list[str] = []
    for point in points:
        if not any(point.startswith(o + "/") or point == o for o in outer):
            outer.append(point)
    return outer


def _fresh_tmp(size: int) -> None:
    """Mount an empty, size-capped tmpfs on /tmp, keeping the read-only binds the sandbox made
    below it. When the installation itself lives under /tmp (a checkout there), bubblewrap binds
    it at the same path; a plain tmpfs over /tmp would hide it and the job could not import the
    libraries it loads lazily. Each bind is cloned (read-only, as it was) before the tmpfs goes
    on and moved back onto the same path in the new tmpfs."""
    carried = []
    try:
        for point in _mounts_under(TMP):
            fd = _libc.syscall(
                SYS_OPEN_TREE,
                AT_FDCWD,
                point.encode(),
                OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC,
            )
            if fd < 0:
                _check(-1, f"open_tree {point}")
            carried.append((point, fd))
        _mount("tmpfs", TMP, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
        for point, fd in carried:
            os.makedirs(point, mode=0o755, exist_ok=True)
            _check(
                _libc.syscall(
                    SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, point.encode(), MOVE_MOUNT_F_EMPTY_PATH
                ),
                f"move_mount {point}",
            )
    finally:
        for _, fd in carried:
            with contextlib.suppress(OSError):
                os.close(fd)


def _only_fds(keep: dict[int, int]) -> None:
    """Make the descriptors exactly `keep` (target fd -> current fd), closing all others."""
    # Copies above every target first, so that no dup2 below clobbers a descriptor still needed.
    moved = {t: fcntl.fcntl(c, fcntl.F_DUPFD_CLOEXEC, 64) for t, c in keep.items()}
    for target, current in moved.items():
        os.dup2(current, target, inheritable=False)
    os.closerange(max(keep) + 1, os.sysconf("SC_OPEN_MAX"))
    for fd in range(max(keep) + 1):
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


class JobLimits(Protocol):
    """What isolation reads of a job's `safeaccess.sandbox.backend.Limits` (a protocol, so that
    the start-up probe need not import pydantic: it runs once per server start)."""

    @property
    def memory_mb(self) -> int: ...
    @property
    def cpu_seconds(self) -> int: ...
    @property
    def tmp_mb(self) -> int: ...
    @property
    def max_processes(self) -> int: ...


class ProbeLimits:
    """Small limits for the start-up probe's job."""

    memory_mb = 256
    cpu_seconds = 10
    tmp_mb = 16
    max_processes = 16


def _status_value(key: str) -> int:
    """A `Vm*` size of this process in bytes, from /proc/self/status."""
    with open("/proc/self/status", "rb") as fh:
        for line in fh:
            if line.startswith(key.encode() + b":"):
                return int(line.split()[1]) * 1024
    return 0


def _rlimits(limits: JobLimits) -> None:
    memory = limits.memory_mb * 1024 * 1024
    # The job inherits the template's libraries and dataset (shared pages it did not allocate):
    # its memory allowance comes on top of them.
    data = _status_value("VmData") + memory
    address_space = _status_value("VmSize") + memory + ADDRESS_SPACE_HEADROOM
    fsize = limits.tmp_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (data, data))
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4


def _drop_bounding_set() -> None:
    """Empty the capability bounding set and the ambient set (while the template's
    CAP_SETPCAP is still held): nothing the job executes can ever be granted a capability."""
    with open("/proc/sys/kernel/cap_last_cap", "rb") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient")


def _clear_capabilities() -> None:
    """After the switch to the job's uid: empty the inheritable set too (the uid change
    emptied the permitted and effective ones; the template's inheritable set would remain)."""
    set_capabilities(0, 0)


def unprivileged_template() -> bool:
    """Whether this template (or job, before its switch) belongs to an unprivileged server:
    a root server's template runs as TEMPLATE_UID in a namespace that maps the jobs' range."""
    return os.getuid() not in (0, TEMPLATE_UID)


def _own_user_namespace(uid: int) -> None:
    """An unprivileged server's job: a user namespace of its own, mapping `uid` (its fresh uid)
    to the one id the template has. The kernel counts RLIMIT_NPROC per user namespace and uid,
    so the job's process limit counts its own processes only, as a root server's fresh host uid
    does; and the job holds no capability in the template's namespace (nor over its siblings,
    each in a namespace of its own). Done before the rlimits: a namespace also caps the counts
    of its ancestors at its creator's RLIMIT_NPROC, which must stay the template's."""
    outer_uid, outer_gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER), "unshare of the job's user namespace")
    map_one_id(uid, outer_uid, uid, outer_gid)


def _switch_user(uid: int) -> None:
    if unprivileged_template():
        # The job's own namespace already maps it to `uid` (its groups cannot be emptied there).
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid:
            raise PermissionError("could not switch to the job's user")
        return
    # In a root server's template, the job's uid is mapped (the same number) in the template's
    # user namespace, and the template's CAP_SETUID/CAP_SETGID there allow the switch.
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid:
        raise PermissionError("could not switch to the job's user")


def _read_request(fd: int) -> bytes:
    chunks = []
    size = 0
    while size <= MAX_REQUEST_BYTES:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, parts: list[bytes | memoryview]) -> None:
    """Write `parts` one after the other, gathered (a reply has a handful of parts)."""
    views = [memoryview(part).cast("B") for part in parts if len(part)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views.pop(0))
        if views:
            views[0] = views[0][written:]


def new_pid_namespace(own: int) -> None:
    """In the template, just before it forks a job: the next child it forks is pid 1 of a new
    pid namespace (the template itself stays where it is). `own` is a descriptor of the
    template's own pid namespace: going back to it first is what lets the kernel accept a new
    namespace for every job."""
    _check(_libc.setns(own, CLONE_NEWPID), "setns of the pid namespace")
    _check(_libc.unshare(CLONE_NEWPID), "unshare of the pid namespace")


def _isolate(uid: int, limits: JobLimits) -> None:
    """Steps 2, 3, 5 and 6 of the module's list (namespaces, mounts, rlimits, uid, capabilities)."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET), "unshare")
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    size = limits.tmp_mb * 1024 * 1024
    _fresh_tmp(size)
    os.chdir(TMP)
    if unprivileged_template():
        _own_user_namespace(uid)
    _rlimits(limits)
    _drop_bounding_set()
    _switch_user(uid)
    _clear_capabilities()


def isolation_probe(uid: int, limits: JobLimits) -> NoReturn:
    """In a child forked by `template_privileges.probe`: isolate as a job would; exit 0 if
    that worked, else print why and exit with EXIT_SETUP_FAILED."""
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
        _isolate(uid, limits)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"job isolation failed: {exc}\n".encode())
        os._exit(EXIT_SETUP_FAILED)
    os._exit(0)


def run_isolated_job(
    *, channel: int, stderr: int, uid: int, limits: JobLimits, dataset: object, program: bytes
) -> NoReturn:
    """In the child the template just forked: isolate, run one job, exit (never returns).

    The child is pid 1 of its own pid namespace: it sees no other process, and when it exits
    the kernel kills whatever it started. `program` is the compiled seccomp filter.
    """
    from safeaccess.sandbox import runner, seccomp

    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
        devnull = os.open(os.devnull, os.O_RDWR)
        keep = {0: devnull, 1: devnull, 2: stderr, JOB_FD: channel}
        if isinstance(dataset, int):
            keep[DATASET_FD] = dataset
            dataset = DATASET_FD
        _only_fds(keep)
        _isolate(uid, limits)
        seccomp.load_compiled(program)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"job isolation failed: {exc}\n".encode())
        os._exit(EXIT_SETUP_FAILED)
    raw = _read_request(JOB_FD)
    request = runner.parse_request(raw)
    reply: list[bytes | memoryview] = (
        [request] if isinstance(request, bytes) else runner.reply_for(request, dataset)
    )
    _write_all(JOB_FD, reply)
    os._exit(0)


def probe() -> None:
    """Check, inside a template's sandbox, that a fork server job can isolate itself here:
    the template's privileges, a pid namespace per job, and in the job its mount namespace,
    fresh /proc and (unprivileged server) its own user namespace. Exits 0 if so; otherwise
    prints why and exits 1. `ProcessBackend.check_available` runs it once at start, in a sandbox built
    as a template's."""
    try:
        enter_own_user_namespace()
        own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        new_pid_namespace(own)
        child = os.fork()
        if child == 0:
            isolation_probe(JOB_UID_FIRST, ProbeLimits())
        _, status = os.waitpid(child, 0)
        if status != 0:
            raise PermissionError("a job could not isolate itself")
    except BaseException as exc:
        print(f"fork server probe: {exc}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)
