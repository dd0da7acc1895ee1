"""Locks every replica sharing a PostgreSQL database sees: the query-set auditor's admissions per
scope (`qss_scope`), a researcher's openings per dataset (the withhold budget) and the steps
charged to one DP ledger (`service`). On SQLite, one process owns the database and only the
in-process half is taken.

A `SharedLock` is the process's own lock of the name first (so one thread per name and process
waits in the database, not every thread), then on PostgreSQL `pg_advisory_xact_lock` inside a
transaction opened for it and ended by `release`: the lock lasts until that transaction ends,
so a crashed replica (its connection gone) or any error frees it, and nothing has to remember
to unlock. A second replica waits in its own `pg_advisory_xact_lock` and, once it holds the
lock, reads what the first one committed. Keys are 64 bits of a SHA-256 of the kind and the
name: two names never share a key unless SHA-256 collides in 64 bits, so a lock never waits for
another name's.
"""

from __future__ import annotations

import hashlib
import threading

from sqlalchemy import Connection, Engine, func, select, text
from sqlalchemy.exc import DBAPIError

#: SQLSTATE of lock_not_available: the wait exceeded `lock_timeout`.
LOCK_NOT_AVAILABLE = "55P03"


class LockTimeout(RuntimeError):
    """The lock was not free within the timeout."""


def advisory_key(kind: str, name: str) -> int:
    """The advisory-lock key of `name` among locks of `kind`: the first 8 bytes of a SHA-256, as
    the signed 64-bit integer PostgreSQL takes (stable across processes, hosts and releases,
    unlike Python's `hash`). The `safeaccess.` prefix keeps it apart from any lock an operator
    may take in the same database."""
    digest = hashlib.sha256(f"safeaccess.{kind}\x00{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class AdvisoryLock:
    """One advisory lock, held by its own transaction from `acquire` to `release`."""

    def __init__(self, engine: Engine, key: int, timeout_seconds: float):
        self.engine = engine
        self.key = key
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
                    f"another replica held the lock for over {self.timeout_seconds} s"
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
            # when it went. What the holder recorded was committed (or not) by its own
            # transactions either way.
            connection.invalidate()
        finally:
            connection.close()


class SharedLock:
    """The process's lock of a name, then (when `shared` is given) its advisory lock. Use
    `acquire`/`release`, or `with`."""

    def __init__(self, local: threading.Lock, shared: AdvisoryLock | None):
        self.local = local
        self.shared = shared

    def acquire(self) -> None:
        """Take both (`LockTimeout` if the advisory lock stays held past its timeout)."""
        self.local.acquire()
        if self.shared is None:
            return
        try:
            self.shared.acquire()
        except BaseException:
            self.local.release()
            raise

    def release(self) -> None:
        try:
            if self.shared is not None:
                self.shared.release()
        finally:
            self.local.release()

    def __enter__(self) -> SharedLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class SharedLocks:
    """The shared locks of one kind, by name, for one process (one per service)."""

    def __init__(self, engine: Engine, kind: str, timeout_seconds: float):
        self.engine = engine
        self.kind = kind
        self.timeout_seconds = timeout_seconds
        # Replicas share a PostgreSQL database; an SQLite file belongs to one server process.
        self.across_replicas = engine.dialect.name == "postgresql"
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def local(self, name: str) -> threading.Lock:
        """The process's lock of `name`."""
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    def lock(self, name: str) -> SharedLock:
        """A new hold on the lock of `name` (not yet acquired)."""
        shared = (
            AdvisoryLock(self.engine, advisory_key(self.kind, name), self.timeout_seconds)
            if self.across_replicas
            else None
        )
        return SharedLock(self.local(name), shared)
