"""The audit scopes' locks and state files, shared by every step of one service.

A scope's lock is an in-process lock and, on PostgreSQL, also the scope's advisory lock
(`store.advisory_locks`), so replicas sharing the database admit one at a time per scope, and
admissions in other scopes never wait. The admission of one step, from taking the lock to
recording the step, is `qss/admission.py`.
"""

from __future__ import annotations

import threading
from pathlib import Path

from safeaccess.server.errors import Unavailable
from safeaccess.server.outcome import QssCommit, QssPointer
from safeaccess.server.qss.gate import StateFiles
from safeaccess.server.store import ledgers
from safeaccess.server.store.advisory_locks import LockTimeout, SharedLock, SharedLocks
from safeaccess.server.store.database import Database

#: The longest a step waits for a lock another replica holds (scope, DP ledger, withhold budget)
#: before it is answered "unavailable, retry": each is held for seconds, not minutes.
LOCK_TIMEOUT_SECONDS = 120.0
#: The kind of the advisory locks of audit scopes (`store.advisory_locks.advisory_key`).
LOCK_KIND = "qss-scope"


class ScopeLock:
    """One admission's hold on a scope's lock (`store.advisory_locks.SharedLock`); a lock held
    too long by another replica is answered "audit unavailable, retry"."""

    def __init__(self, lock: SharedLock):
        self.lock = lock

    def acquire(self) -> None:
        try:
            self.lock.acquire()
        except LockTimeout as exc:
            raise Unavailable(
                f"the query-set audit of this scope is busy ({exc}); retry the same reveal later",
                code="audit_unavailable",
            ) from exc

    def release(self) -> None:
        self.lock.release()


class ScopeAuditor:
    """The locks, state files and (on SQLite) state pointers of every scope, shared by all steps
    of one service."""

    def __init__(
        self, root: Path, store: Database, *, lock_timeout_seconds: float = LOCK_TIMEOUT_SECONDS
    ):
        self.files = StateFiles(root)
        self.store = store
        self.locks = SharedLocks(store.engine, LOCK_KIND, lock_timeout_seconds)
        # An SQLite file belongs to one server process, so the pointer this process last
        # recorded for a scope is the stored one: the next admission (under the scope's lock)
        # need not read it. Replicas sharing PostgreSQL read it, since another may have moved it.
        # Either way the step's guarded UPDATE of the pointer is what decides.
        self._pointers: dict[str, QssPointer] | None = None if self.locks.across_replicas else {}
        self._guard = threading.Lock()

    def lock(self, scope: str) -> ScopeLock:
        """A new hold on the scope's lock (not yet acquired)."""
        return ScopeLock(self.locks.lock(scope))

    def pointer(self, scope: str) -> QssPointer | None:
        """Where the scope's state is (the caller holds its lock): kept when this process
        recorded it last (SQLite), else read."""
        if self._pointers is not None:
            with self._guard:
                kept = self._pointers.get(scope)
            if kept is not None:
                return kept
        return ledgers.qss_pointer(self.store, scope)

    def recorded(self, scope: str, before: QssPointer | None, commit: QssCommit) -> None:
        """The step that moved the scope's pointer from `before` by `commit` is recorded."""
        if self._pointers is not None:
            admitted = (before.admitted if before is not None else 0) + 1
            moved = QssPointer(digest=commit.digest, n_records=commit.n_records, admitted=admitted)
            with self._guard:
                self._pointers[scope] = moved

    def forget(self, scope: str) -> None:
        """The kept pointer may be stale (a step's record failed): read it next time."""
        if self._pointers is not None:
            with self._guard:
                self._pointers.pop(scope, None)
