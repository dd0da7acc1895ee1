"""The fork server template's own privileges: a user namespace of its own (inside the sandbox).

A root server starts each template under a privileged bubblewrap: bubblewrap has to bind the
interpreter, the virtualenv and the dataset, which may lie below directories only host root
may enter (an interpreter under /root, microdata readable by root only), so it cannot itself
run in a user namespace mapping an unprivileged uid. The template therefore leaves the host's
privileges itself, first thing, before it imports a library or parses a byte of the dataset
(`enter_own_user_namespace`):

1. the dataset is already open (the template's caller opened it as root);
2. bubblewrap's read-only covers below /proc are detached: the kernel lets a less privileged
   user namespace mount a fresh proc (each job does) only where a proc mount is fully visible;
   nothing below /proc is writable by anything but host root, which no process here is;
3. a map writer is forked: it alone stays host root (with bubblewrap's CAP_SYS_ADMIN,
   CAP_SETUID and CAP_SETGID: writing a map takes the first over the new namespace and the
   others in its parent), waits, writes the new namespace's uid and gid maps and exits;
4. the launcher switches to `TEMPLATE_UID` with no groups, which empties every capability set it
   held in the host's user namespace, then unshares a user namespace and a pid namespace, both
   owned by that unprivileged uid. The maps make `TEMPLATE_UID` and the jobs' uids (the range
   `JOB_UID_FIRST` .. + `JOB_UID_COUNT`) the same numbers inside as outside; host root (uid 0) is
   not mapped, so nothing inside can act on root's files or processes;
5. the launcher forks the template proper, pid 1 of the new pid namespace (its jobs' pid
   namespaces must be owned by the template's user namespace, so that it may create one per
   job), keeps no capability at all and waits for it;
6. the template keeps `TEMPLATE_CAPS` in its own user namespace only (permitted, effective and
   bounding; nothing inheritable or ambient), and returns to serve.

An unprivileged server's template (`_stay_unprivileged`) is already in bubblewrap's user
namespace, owned by the service user: it unshares a user and pid namespace of its own mapping
its one id and forks the template proper likewise; its jobs give themselves user namespaces.

Whatever the template or a job holds is thus a capability of a namespace that is a child of the
host's, and none of the host's: it cannot read a file of host root, signal or trace a host
process, mount in the sandbox's mount namespace or load anything into the kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from typing import NoReturn

CLONE_NEWUSER = 0x1000_0000
CLONE_NEWPID = 0x2000_0000
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x2008_0522
PROC = "/proc"

# The template's uid and gid (host and namespace alike), just below the jobs' range.
TEMPLATE_UID = 0x6FFF_FFFF
# The jobs' fresh uids (`safeaccess.sandbox.process.backend` picks one per job from this range).
JOB_UID_FIRST = 0x7000_0000
JOB_UID_COUNT = 0x1000_0000
# One extent, identical inside and out: the template's id followed by every job id.
ID_MAP = f"{TEMPLATE_UID} {TEMPLATE_UID} {JOB_UID_FIRST + JOB_UID_COUNT - TEMPLATE_UID}\n"
# What the template keeps in its own user namespace, for its jobs: kill (5), setgid (6),
# setuid (7), setpcap (8) and sys_admin (21): new namespaces and mounts, a fresh uid, an empty
# bounding set, killing a job.
TEMPLATE_CAPS = (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 21)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def set_capabilities(effective: int, permitted: int) -> None:
    """Set this process's effective and permitted capability sets (bit masks) and empty its
    inheritable set. (Python's standard library has no capset; ctypes keeps the sandbox free of
    a compiled dependency for three system calls.)"""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    for i in range(2):
        data[i].effective = (effective >> (32 * i)) & 0xFFFF_FFFF
        data[i].permitted = (permitted >> (32 * i)) & 0xFFFF_FFFF
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def keep_only(caps: int) -> None:
    """Reduce every capability set to `caps` (bounding, permitted, effective) and empty the
    ambient and inheritable sets. Needs CAP_SETPCAP while the bounding set shrinks."""
    with open(f"{PROC}/sys/kernel/cap_last_cap", "rb") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        if not caps & (1 << cap):
            _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient")
    set_capabilities(caps, caps)


def _status_caps(key: str) -> int:
    with open(f"{PROC}/self/status", "rb") as fh:
        for line in fh:
            if line.startswith(key.encode() + b":"):
                return int(line.split()[1], 16)
    raise PermissionError(f"no {key} in {PROC}/self/status")


def _uncover_proc() -> None:
    """Detach every mount below /proc (bubblewrap's read-only covers), deepest first."""
    points = []
    with open(f"{PROC}/self/mountinfo", "rb") as fh:
        for line in fh:
            point = line.split()[4].decode("utf-8", "surrogateescape")
            if point.startswith(PROC + "/"):
                points.append(point)
    for point in sorted(points, key=len, reverse=True):
        _check(_libc.umount2(point.encode(), MNT_DETACH), f"detaching {point}")


def map_one_id(inner_uid: int, outer_uid: int, inner_gid: int, outer_gid: int) -> None:
    """In a user namespace just made: map the one id an unprivileged process may map (its own
    uid and gid, seen inside as `inner_*`), with setgroups denied, as the kernel requires of an
    unprivileged gid map (the process keeps its groups and can never change them)."""
    for name, data in (
        ("setgroups", "deny"),
        ("uid_map", f"{inner_uid} {outer_uid} 1\n"),
        ("gid_map", f"{inner_gid} {outer_gid} 1\n"),
    ):
        with open(f"{PROC}/self/{name}", "w") as fh:
            fh.write(data)


def _start_map_writer(target: int) -> tuple[int, int]:
    """Fork the process that writes `target`'s uid and gid maps once `target` has unshared its
    user namespace (mapping a range of host ids takes CAP_SETUID and CAP_SETGID in the host's
    user namespace, which `target` will no longer hold). Returns (pid, descriptor): one byte
    written to the descriptor tells it to write; closing it unwritten tells it to exit."""
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(go_write)
            _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
            if os.read(go_read, 1) == b"g":
                # The gid map first: written by a process privileged in the parent namespace,
                # it leaves setgroups allowed inside, where each job empties its groups.
                for name in ("gid_map", "uid_map"):
                    with open(f"{PROC}/{target}/{name}", "w") as fh:
                        fh.write(ID_MAP)
                status = 0
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.write(2, f"template: cannot map its user namespace: {exc}\n".encode())
        finally:
            os._exit(status)
    os.close(go_read)
    return pid, go_write


def _wait_and_exit(template: int) -> NoReturn:
    """The launcher: hold nothing, wait for the template, end as it ended."""
    # Not the template's control socket nor its dataset: the host sees the socket close when
    # the template ends, whatever the launcher does.
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    keep_only(0)
    while True:
        try:
            _, status = os.waitpid(template, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def enter_own_user_namespace() -> None:
    """Leave host root for a user namespace of the template's own (see the module's docstring).

    Returns in the template proper, pid 1 of a new pid namespace, holding `TEMPLATE_CAPS` in
    its own user namespace and no capability in the host's; the process that called it never
    returns (it waits for the template and exits with its status). A template of an
    unprivileged server is already in a user namespace of the service user's (bubblewrap's):
    `_stay_unprivileged` keeps only what its jobs need there."""
    if os.getuid() != 0:
        _stay_unprivileged()
        return
    _uncover_proc()
    writer, go = _start_map_writer(os.getpid())
    try:
        os.setgroups([])
        os.setresgid(TEMPLATE_UID, TEMPLATE_UID, TEMPLATE_UID)
        os.setresuid(TEMPLATE_UID, TEMPLATE_UID, TEMPLATE_UID)
        # Leaving uid 0 emptied the permitted and effective sets; clearing them again covers
        # a process started with "keep capabilities" set.
        set_capabilities(0, 0)
        if _status_caps("CapPrm") or _status_caps("CapEff"):
            raise PermissionError("the template kept host capabilities")
        _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWPID), "unshare of user and pid namespaces")
        os.write(go, b"g")
    finally:
        os.close(go)
    _, status = os.waitpid(writer, 0)
    if status != 0 or os.getuid() != TEMPLATE_UID or os.getgid() != TEMPLATE_UID:
        raise PermissionError("the template's user namespace could not be mapped")
    template = os.fork()
    if template != 0:
        _wait_and_exit(template)
    # The template proper: it dies with the launcher.
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    keep_only(TEMPLATE_CAPS)
    if os.getuid() == 0 or os.geteuid() == 0:  # pragma: no cover - a broken map
        print("template: still root after entering its namespace", file=sys.stderr)
        raise PermissionError("the template could not leave root")


def _stay_unprivileged() -> None:
    """The template of an unprivileged server, in bubblewrap's user namespace (which maps the
    service user's id only). Bubblewrap granted CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID,
    CAP_SETPCAP and CAP_KILL of that namespace, none of the host's.

    As a root server's template does, it unshares a user namespace and a pid namespace of its
    own (the jobs' pid namespaces must be owned by a namespace where the template holds
    CAP_SYS_ADMIN, and bubblewrap's pid namespace is owned by an outer one of bubblewrap's),
    maps there the one id it has (the kernel lets a process map its own id), and forks the
    template proper as pid 1 of the new pid namespace, keeping `TEMPLATE_CAPS` of that namespace
    (permitted, effective and bounding; nothing inheritable or ambient). No second id can be
    mapped without host privileges: each job gives itself a user namespace of its own instead
    (`safeaccess.sandbox.process.isolate`)."""
    _uncover_proc()
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWPID), "unshare of user and pid namespaces")
    # setgroups is denied already (bubblewrap's namespace); the map of one's own gid needs it.
    map_one_id(uid, uid, gid, gid)
    template = os.fork()
    if template != 0:
        _wait_and_exit(template)
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    keep_only(TEMPLATE_CAPS)
    if _status_caps("CapAmb") or _status_caps("CapInh"):  # pragma: no cover - a kernel change
        raise PermissionError("the template kept inheritable or ambient capabilities")
