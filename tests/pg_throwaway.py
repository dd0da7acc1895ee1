"""A throwaway PostgreSQL cluster for tests: initdb into a temporary folder, started with the
local pg_ctl on a free port and a socket in that folder (as the `postgres` user when the tests
run as root, since initdb refuses root). The store tests share one for the session
(`postgres_url` in tests/server/conftest.py); the cluster tests start their own, because they
restart it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile


def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def available() -> bool:
    """Whether initdb and pg_ctl are on PATH."""
    return shutil.which("initdb") is not None and shutil.which("pg_ctl") is not None


class ThrowawayPostgres:
    """One cluster: `start()` creates and starts it, `restart()` stops it (fast shutdown: every
    connection is closed) and starts it again on the same port, `remove()` stops it at once and
    deletes it. `url` is the SQLAlchemy URL of its `postgres` database as superuser `sa`."""

    def __init__(self) -> None:
        initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise RuntimeError("initdb/pg_ctl are not on PATH")
        self._initdb, self._pg_ctl = initdb, pg_ctl
        self._prefix: list[str] = []
        self.folder = tempfile.mkdtemp(prefix="safeaccess-pg-")
        if os.geteuid() == 0:
            import pwd

            user = pwd.getpwnam("postgres")
            os.chown(self.folder, user.pw_uid, user.pw_gid)
            self._prefix = ["runuser", "-u", "postgres", "--"]
        self.data = os.path.join(self.folder, "data")
        self.port = free_port()
        self.url = f"postgresql+psycopg://sa@/postgres?host={self.folder}&port={self.port}"

    def _quiet(self, *command: str, check: bool = True) -> None:
        subprocess.run(
            [*self._prefix, *command],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=check,
        )

    def start(self) -> None:
        """Create the cluster if it does not exist yet, then start it and wait until it answers."""
        if not os.path.exists(self.data):
            self._quiet(self._initdb, "-D", self.data, "-A", "trust", "-U", "sa", "--no-sync")
        options = f"-k {self.folder} -p {self.port} -c listen_addresses=''"
        self._quiet(self._pg_ctl, "-D", self.data, "-w", "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop it: `fast` closes every connection and shuts down cleanly; `immediate` as if the
        machine lost power (recovery from the WAL at the next start)."""
        self._quiet(self._pg_ctl, "-D", self.data, "-w", "-m", mode, "stop")

    def restart(self, mode: str = "fast") -> None:
        """Stop, then start again on the same port and socket."""
        self.stop(mode)
        self.start()

    def remove(self) -> None:
        """Stop at once and delete the cluster's files."""
        self._quiet(self._pg_ctl, "-D", self.data, "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.folder, ignore_errors=True)
