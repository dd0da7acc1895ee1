"""Running a command as an unprivileged service user (docs/deploy.md's `safeaccess` user), from
a test or a benchmark run as root: `system_user` creates the user as the deployment guide does,
`as_user` builds the command line. Shared by tests/sandbox/test_sandbox_owner.py,
tests/cluster/test_deploy_doc.py and benchmarks/sandbox_user.py (which puts tests/ on its path)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: docs/deploy.md's system user, with useradd (no home, no login shell).
USERADD = ("useradd", "--system", "--user-group", "--no-create-home", "--shell", "/bin/false")


def system_user(name: str) -> tuple[pwd.struct_passwd, bool]:
    """The system user `name`, created with `USERADD` if missing; and whether it was created
    here (then the caller removes it with `userdel` when done)."""
    try:
        return pwd.getpwnam(name), False
    except KeyError:
        subprocess.run([*USERADD, name], check=True)
        return pwd.getpwnam(name), True


def as_user(user: str, argv: list[str], *, umask: str | None = None) -> list[str]:
    """`argv` run as `user`, with the user's own environment (HOME from its passwd entry) and
    `umask` if given. The interpreter may live below a directory others cannot enter (a Python
    under /root): the command then runs in a private mount namespace where that directory is an
    empty tmpfs others may traverse, holding only the interpreter's tree (moved there through an
    empty directory, removed again once the mount has left it). setpriv executes the command in
    place (runuser would fork and wait), so the child's pid is the command's: a test that
    SIGKILLs it kills the command itself."""
    needed = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, str(REPO))}
    script = ["set -e"]
    for path in sorted(needed):
        parts = Path(path).parts
        for depth in range(2, len(parts)):
            closed = Path(*parts[:depth])
            if closed.is_dir() and not closed.stat().st_mode & 0o001:
                inner = Path(*parts[: depth + 1])
                keep = tempfile.mkdtemp(prefix="sb-keep-")
                script += [
                    f"mount --bind '{inner}' '{keep}'",
                    f"mountpoint -q '{closed}' || mount -t tmpfs -o mode=0755 tmpfs '{closed}'",
                    f"mkdir -p '{inner}'",
                    f"mount --move '{keep}' '{inner}'",
                    f"rmdir '{keep}'",
                ]
                break
    become = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--reset-env"]
    if umask is not None:
        become += ["sh", "-c", f'umask {umask} && exec "$@"', "unit"]
    if len(script) == 1:
        return [*become, *argv]
    script.append('exec "$@"')
    return [
        *("unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)),
        *("as-user", *become, *argv),
    ]
