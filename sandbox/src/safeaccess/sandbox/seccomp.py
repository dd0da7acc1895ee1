"""The sandbox's seccomp filter: one deny-by-default allow-list for both backends.

The process backend installs it in each job (before the job reads data or runs anything a
researcher wrote) through libseccomp, loaded with ctypes from the system's `libseccomp.so.2`;
the Docker backend hands the same list to the engine as a seccomp profile (`docker_profile()`),
instead of the engine's default profile.

Every system call not listed fails with EPERM (not a kill: a library probing an optional call,
say `sched_setaffinity`, then falls back as it would in any locked-down container). The list is
what CPython, numpy, pandas, pyarrow, scipy and statsmodels use to compute an analysis and what a
`script` plausibly needs (files under /tmp, pipes, threads, fork); see docs/sandbox.md for the
groups and for what is deliberately missing (ptrace, mount, namespaces, bpf, keys, sockets,
execve, ...).

This module runs inside the sandbox too: it imports only the standard library.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from typing import Any

# Grouped for the documentation; the order does not matter to the filter.
ALLOWED_GROUPS: dict[str, tuple[str, ...]] = {
    "memory": (
        "brk",
        "mmap",
        "munmap",
        "mprotect",
        "mremap",
        "madvise",
        "mincore",
        "msync",
        "membarrier",
        "get_mempolicy",
    ),
    "files and descriptors": (
        "read",
        "write",
        "pread64",
        "pwrite64",
        "readv",
        "writev",
        "preadv",
        "pwritev",
        "preadv2",
        "pwritev2",
        "open",
        "openat",
        "close",
        "close_range",
        "creat",
        "stat",
        "fstat",
        "lstat",
        "newfstatat",
        "statx",
        "statfs",
        "fstatfs",
        "lseek",
        "access",
        "faccessat",
        "faccessat2",
        "readlink",
        "readlinkat",
        "getdents",
        "getdents64",
        "getcwd",
        "chdir",
        "fchdir",
        "mkdir",
        "mkdirat",
        "rmdir",
        "unlink",
        "unlinkat",
        "rename",
        "renameat",
        "renameat2",
        "link",
        "linkat",
        "symlink",
        "symlinkat",
        "chmod",
        "fchmod",
        "fchmodat",
        "truncate",
        "ftruncate",
        "fallocate",
        "fsync",
        "fdatasync",
        "fcntl",
        "flock",
        "dup",
        "dup2",
        "dup3",
        "pipe",
        "pipe2",
        "ioctl",
        "umask",
        "utimensat",
        "fadvise64",
        "sendfile",
        "copy_file_range",
        "memfd_create",
    ),
    "polling": (
        "select",
        "pselect6",
        "poll",
        "ppoll",
        "epoll_create",
        "epoll_create1",
        "epoll_ctl",
        "epoll_wait",
        "epoll_pwait",
        "epoll_pwait2",
        "eventfd",
        "eventfd2",
    ),
    "already-open sockets (the job channel)": (
        "recvfrom",
        "sendto",
        "recvmsg",
        "sendmsg",
        "shutdown",
        "getsockopt",
        "getsockname",
        "getpeername",
    ),
    "signals and timers": (
        "rt_sigaction",
        "rt_sigprocmask",
        "rt_sigreturn",
        "rt_sigsuspend",
        "rt_sigpending",
        "rt_sigtimedwait",
        "sigaltstack",
        "kill",
        "tgkill",
        "tkill",
        "pause",
        "alarm",
        "setitimer",
        "getitimer",
        "timer_create",
        "timer_settime",
        "timer_gettime",
        "timer_getoverrun",
        "timer_delete",
    ),
    "time": (
        "clock_gettime",
        "clock_getres",
        "clock_nanosleep",
        "nanosleep",
        "gettimeofday",
        "time",
    ),
    "threads": (
        "futex",
        "futex_waitv",
        "set_robust_list",
        "get_robust_list",
        "set_tid_address",
        "rseq",
        "sched_yield",
        "sched_getaffinity",
        "sched_getparam",
        "sched_getscheduler",
        "sched_get_priority_max",
        "sched_get_priority_min",
        "getpriority",
    ),
    "processes (clone without namespace flags)": (
        "fork",
        "vfork",
        "exit",
        "exit_group",
        "wait4",
        "waitid",
        "getpid",
        "getppid",
        "gettid",
        "getuid",
        "geteuid",
        "getgid",
        "getegid",
        "getresuid",
        "getresgid",
        "getgroups",
        "getpgrp",
        "getpgid",
        "getsid",
        "prctl",
        "arch_prctl",
        "uname",
        "sysinfo",
        "getrlimit",
        "prlimit64",
        "getrusage",
        "times",
        "getrandom",
    ),
}
ALLOWED: tuple[str, ...] = tuple(name for group in ALLOWED_GROUPS.values() for name in group)

# Namespace flags that `clone` must not carry (a job must not make new namespaces: user
# namespaces are the usual way into kernel attack surface). CLONE_NEWTIME (0x80) is left out: for
# clone() the low byte is the exit signal.
CLONE_NAMESPACE_FLAGS = (
    0x0002_0000  # CLONE_NEWNS
    | 0x0200_0000  # CLONE_NEWCGROUP
    | 0x0400_0000  # CLONE_NEWUTS
    | 0x0800_0000  # CLONE_NEWIPC
    | 0x1000_0000  # CLONE_NEWUSER
    | 0x2000_0000  # CLONE_NEWPID
    | 0x4000_0000  # CLONE_NEWNET
)
# clone3 passes its flags in memory, which a filter cannot inspect: refuse it with ENOSYS, so
# that glibc falls back to clone (which is checked).
ENOSYS_CALLS = ("clone3",)
# Needed in a container on top of the list: the runtime installs the filter before it starts
# the entry point (execve), and the container's init (tini) puts the job in its own process group.
DOCKER_EXTRA = ("execve", "setpgid")

# Refused calls the tests and the docs name explicitly (every other unlisted call is refused too).
NOTABLY_DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "socket",
    "socketpair",
    "connect",
    "bind",
    "execve",
    "execveat",
    "kexec_load",
    "init_module",
    "finit_module",
    "open_by_handle_at",
    "pidfd_open",
    "pidfd_getfd",
    "kcmp",
    "setuid",
    "capset",
    "personality",
)

_SCMP_ACT_ALLOW = 0x7FFF_0000
_SCMP_ACT_ERRNO = 0x0005_0000
_SCMP_CMP_MASKED_EQ = 7
_SCMP_FLTATR_CTL_TSYNC = 4
_NR_SCMP_ERROR = -1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
LIBRARY = "libseccomp.so.2"


class SeccompUnavailable(RuntimeError):
    """libseccomp cannot be loaded or the filter cannot be installed."""


class _ArgCmp(ctypes.Structure):
    _fields_ = (
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    )


def _errno_action(code: int) -> int:
    return _SCMP_ACT_ERRNO | (code & 0xFFFF)


def _library() -> Any:
    try:
        lib = ctypes.CDLL(LIBRARY, use_errno=True)
    except OSError as exc:
        raise SeccompUnavailable(
            f"{LIBRARY} cannot be loaded ({exc}); install the libseccomp2 system package"
        ) from exc
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = (ctypes.c_uint32,)
    lib.seccomp_release.argtypes = (ctypes.c_void_p,)
    lib.seccomp_load.argtypes = (ctypes.c_void_p,)
    lib.seccomp_attr_set.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32)
    lib.seccomp_syscall_resolve_name.argtypes = (ctypes.c_char_p,)
    lib.seccomp_rule_add_array.argtypes = (
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    )
    return lib


def install() -> None:
    """Install the allow-list filter on the calling process (and its threads); irrevocable.

    Raises SeccompUnavailable if it cannot be installed: the caller must then not run the job.
    """
    lib = _library()
    ctx = _build(lib)
    try:
        rc = lib.seccomp_load(ctx)
        if rc < 0:
            raise SeccompUnavailable(f"seccomp_load failed ({-rc})")
    finally:
        lib.seccomp_release(ctx)


def compile_filter() -> bytes:
    """The filter as a classic BPF program, compiled once (by a fork server template) so that
    each job only has to load it (`load_compiled`): compiling takes tens of milliseconds."""
    lib = _library()
    lib.seccomp_export_bpf.argtypes = (ctypes.c_void_p, ctypes.c_int)
    ctx = _build(lib)
    read_end, write_end = os.pipe()
    try:
        rc = lib.seccomp_export_bpf(ctx, write_end)
        os.close(write_end)
        write_end = -1
        if rc < 0:
            raise SeccompUnavailable(f"seccomp_export_bpf failed ({-rc})")
        chunks = []
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
    finally:
        lib.seccomp_release(ctx)
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    program = b"".join(chunks)
    if not program or len(program) % 8:
        raise SeccompUnavailable("libseccomp exported no filter")
    return program


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def load_compiled(program: bytes) -> None:
    """Load a program from `compile_filter` on the calling (single-threaded) process."""
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SeccompUnavailable(f"no_new_privs refused ({ctypes.get_errno()})")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise SeccompUnavailable(f"the seccomp filter was refused ({ctypes.get_errno()})")


def _build(lib: Any) -> Any:
    """A libseccomp context holding the allow-list (the caller releases it)."""
    ctx = lib.seccomp_init(_errno_action(errno.EPERM))
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:

        def add(name: str, action: int, args: list[_ArgCmp]) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr == _NR_SCMP_ERROR:
                return  # not a call on this architecture (e.g. `open` on arm64)
            array = (_ArgCmp * len(args))(*args) if args else None
            rc = lib.seccomp_rule_add_array(ctx, action, nr, len(args), array)
            if rc < 0:
                raise SeccompUnavailable(f"seccomp rule for {name} refused ({-rc})")

        if lib.seccomp_attr_set(ctx, _SCMP_FLTATR_CTL_TSYNC, 1) < 0:
            raise SeccompUnavailable("seccomp cannot synchronise the filter across threads")
        for name in ALLOWED:
            add(name, _SCMP_ACT_ALLOW, [])
        add("clone", _SCMP_ACT_ALLOW, [_ArgCmp(0, _SCMP_CMP_MASKED_EQ, CLONE_NAMESPACE_FLAGS, 0)])
        for name in ENOSYS_CALLS:
            add(name, _errno_action(errno.ENOSYS), [])
    except BaseException:
        lib.seccomp_release(ctx)
        raise
    return ctx


def _docker_architectures() -> list[str]:
    machine = platform.machine()
    if machine in ("aarch64", "arm64"):
        return ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]
    return ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]


def docker_profile() -> dict[str, Any]:
    """The same allow-list as a Docker seccomp profile (JSON-serialisable)."""
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.EPERM,
        "architectures": _docker_architectures(),
        "syscalls": [
            {"names": sorted({*ALLOWED, *DOCKER_EXTRA}), "action": "SCMP_ACT_ALLOW"},
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ALLOW",
                "args": [
                    {
                        "index": 0,
                        "value": CLONE_NAMESPACE_FLAGS,
                        "valueTwo": 0,
                        "op": "SCMP_CMP_MASKED_EQ",
                    }
                ],
            },
            {"names": list(ENOSYS_CALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
        ],
    }


def check_available() -> None:
    """Raise SeccompUnavailable unless libseccomp can be loaded (checked before serving jobs)."""
    _library()
