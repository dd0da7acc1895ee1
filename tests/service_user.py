"""Running a command as an unprivileged service user the test created (docs/deploy.md's
`safeaccess` user), from a test run as root."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def as_user(user: str, argv: list[str], *, umask: str | None = None) -> list[str]:
    """`argv` run as `user`, with the user's own environment (HOME from its passwd entry) and
    `umask` if given. The interpreter may live below a directory others cannot enter (a Python
    under /root): the command then runs in a private mount namespace where that directory is an
    empty tmpfs others may traverse, holding only the interpreter's tree. setpriv executes the
    command in place, so the child's pid is the command's."""
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
