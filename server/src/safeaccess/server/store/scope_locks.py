"""PostgreSQL advisory locks that serialise the query-set auditor's admissions per scope across
every replica sharing the database (`qss_scope` takes them; SQLite has one process and keeps
`qss_scope`'s in-process locks).

The lock is `pg_advisory_xact_lock` taken inside a transaction opened for the admission: it
lasts until that transaction ends, so a crashed replica (its connection gone) or any error frees
it, and nothing has to remember to unlock. Another replica admitting in the same scope waits in
its own `pg_advisory_xact_lock` and, once it holds the lock, reads the state the first one
committed. Keys are 64-bit hashes of the scope's name: scopes never share a key unless SHA-256
collides in 64 bits, so an admission in one scope never waits for another.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import Connection, Engine, func, select, text
from sqlalchemy.exc import DBAPIError

#: Distinguishes these keys from any other advisory lock an operator may take in the database.
_DOMAIN = b"safeaccess.qss-scope\x00"
#: SQLSTATE of lock_not_available: the wait exceeded `lock_timeout`.
LOCK_NOT_AVAILABLE = "55P03"


class LockTimeout(RuntimeError):
    """The scope's lock was not free within the timeout."""


def advisory_key(scope: str) -> int:
    """The scope's advisory-lock key: the first 8 bytes of a SHA-256 of its name, as the signed
    64-bit integer PostgreSQL takes (stable across processes, hosts and releases, unlike
    Python's `hash`)."""
    digest = hashlib.sha256(_DOMAIN + scope.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class AdvisoryScopeLock:
    """The advisory lock of one scope, held by its own transaction from `acquire` to `release`."""

    def __init__(self, engine: Engine, scope: str, timeout_seconds: float):
        self.engine = engine
        self.key = advisory_key(scope)
        self.timeout_seconds = timeout_seconds
        self._connection: Connection | None = None

    def acquire(self) -> None:
        """Wait for the lock (at most the timeout; then `LockTimeout`)."""
        assert self._connection is None, "the lock is already held"
        connection = self.engine.connect()
        try:
            connection.begin()
            # SET LOCAL lasts for this transaction only; the pooled connection is left as found.
            milliseconds = max(1, int(self.timeout_seconds * 1000))
            connection.execute(text(f"SET LOCAL lock_timeout = {milliseconds}"))
            connection.execute(select(func.pg_advisory_xact_lock(self.key)))
        except DBAPIError as exc:
            connection.rollback()
            connection.close()
            if getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                raise LockTimeout(
                    f"another admission held the scope's lock for over {self.timeout_seconds} s"
                ) from exc
            raise
        except BaseException:
            connection.rollback()
            connection.close()
            raise
        self._connection = connection

    def release(self) -> None:
        """End the lock's transaction, which frees the lock (it wrote nothing to keep)."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            connection.rollback()
        except DBAPIError:
            # The connection is gone: the server ended its transaction, and freed the lock,
            # when it went. The step was recorded (or not) by its own transaction either way.
            connection.invalidate()
        finally:
            connection.close()
