"""The researcher's own safeaccess directory ($SAFEACCESS_HOME, else ~/.safeaccess): where the
client keeps keys, the journal of sealed sequences and what it caches from a centre.

Everything kept here can bind or identify the researcher (a sealed sequence holds every step she
committed to), so directories are created 0700 and files 0600 from their creation on, and a file
is replaced by renaming a complete copy over it, never rewritten in place (a crash leaves the old
file or the new one, not half of each).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def safeaccess_home() -> Path:
    """$SAFEACCESS_HOME if set, else ~/.safeaccess."""
    home = os.environ.get("SAFEACCESS_HOME")
    return Path(home) if home else Path.home() / ".safeaccess"


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner can read (created 0700 with its parents)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` with mode 0600, atomically (a temporary file renamed over it)."""
    private_dir(path.parent)
    # mkstemp: a name of its own per call (0600, O_EXCL), so two threads or processes of one
    # user writing the same file never share a temporary one (a name from the pid alone did)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def write_json(path: Path, value: Any) -> None:
    write_private(path, json.dumps(value, indent=1, sort_keys=True).encode("utf-8") + b"\n")


def read_json(path: Path) -> Any:
    """The JSON in `path`, or None when it is missing or unreadable (a cache, not a source)."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


__all__ = ["private_dir", "read_json", "safeaccess_home", "write_json", "write_private"]
