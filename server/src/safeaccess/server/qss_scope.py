"""Serialised admission per audit scope: the server-side half of the query-set auditor.

One `AuditSession` per step. The sandbox runs outside any lock; once the rules have checked the
output, the session takes the scope's lock, reads the scope's state pointer, admits or refuses
(`qss_gate.gate`), writes an admitted state's file, and keeps the lock until the caller has
recorded the step with `Store.settle_step(qss=session.commit)`. Before the output, the state
admits the populations of the dataset's versions it has not decided yet (`qss_universe`): their
row counts are published, so they are released before anything else.

The scope's lock is an in-process lock and, on PostgreSQL, also the scope's advisory lock
(`store.advisory_locks`), so replicas sharing the database admit one at a time per scope: the second
waits and then reads the state the first committed, and admissions in other scopes never wait.
As a backstop (SQLite files opened by several processes), the pointer row is read `FOR UPDATE`
when the step is recorded and compared with the state the admission started from; if another
admission moved it, the caller asks the session to admit again against the new state
(`regate`), without re-running the sandbox.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.decision import Decision
from safeaccess.rules.outputs import Output
from safeaccess.server.errors import Unavailable
from safeaccess.server.outcome import QssCommit
from safeaccess.server.qss_gate import AuditUnavailable, StateFiles, commit_for, gate, policy_for
from safeaccess.server.qss_settings import QssSettings, scope_key
from safeaccess.server.qss_universe import (
    Population,
    PopulationUnavailable,
    admit_populations,
    records_needed,
)
from safeaccess.server.store import Store
from safeaccess.server.store.advisory_locks import LockTimeout, SharedLock, SharedLocks

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
    """The locks and state files of every scope, shared by all steps of one service."""

    def __init__(
        self, root: Path, store: Store, *, lock_timeout_seconds: float = LOCK_TIMEOUT_SECONDS
    ):
        self.files = StateFiles(root)
        self.store = store
        self.locks = SharedLocks(store.engine, LOCK_KIND, lock_timeout_seconds)

    def lock(self, scope: str) -> ScopeLock:
        """A new hold on the scope's lock (not yet acquired)."""
        return ScopeLock(self.locks.lock(scope))

    def session(
        self,
        *,
        dataset: str,
        settings: QssSettings,
        threshold: int,
        researcher: str,
        project: str,
        ids: np.ndarray,
        populations: Callable[[], Sequence[Population]],
        analysis: dict[str, Any] | None = None,
        metadata: DatasetMetadata | None = None,
    ) -> AuditSession:
        """The audit of one step on a version whose positions map to `ids`; `populations`
        lists every registered version's population (read when the step is admitted);
        `analysis` and `metadata` define the step's query sets on the domain grid."""
        scope = scope_key(dataset, settings.scope, researcher=researcher, project=project)
        session = AuditSession(self, scope, settings, threshold, ids, populations)
        session.analysis, session.metadata = analysis, metadata
        return session


class AuditSession:
    """The audit of one step: call it as the pipeline's `audit`, then settle, then `release`."""

    def __init__(
        self,
        auditor: ScopeAuditor,
        scope: str,
        settings: QssSettings,
        threshold: int,
        ids: np.ndarray,
        populations: Callable[[], Sequence[Population]],
    ):
        self.auditor = auditor
        self.populations = populations
        self.scope = scope
        self.policy = policy_for(settings, threshold)
        self.ids = ids
        self.commit: QssCommit | None = None
        self.facts: dict[str, Any] = {}
        self.analysis: dict[str, Any] | None = None
        self.metadata: DatasetMetadata | None = None
        self._lock = auditor.lock(scope)
        self._held = False
        self._checked: tuple[Output, Decision] | None = None

    def __call__(self, output: Output, decision: Decision) -> Decision:
        self._checked = (output, decision)
        if not self._held:
            self._lock.acquire()
            self._held = True
        return self.regate()

    def regate(self) -> Decision:
        """Admit the checked output against the scope's current state (lock held)."""
        assert self._checked is not None and self._held
        output, decision = self._checked
        store, files = self.auditor.store, self.auditor.files
        pointer = store.qss_pointer(self.scope)
        populations = self.populations()
        n_records = max(
            int(self.ids.max()) + 1 if len(self.ids) else 0,
            pointer.n_records if pointer is not None else 0,
            records_needed(populations),
        )
        try:
            loaded = files.load(self.scope, pointer, n_records)
            try:
                prepared, universe = admit_populations(loaded, populations, self.policy)
            except PopulationUnavailable as exc:
                raise AuditUnavailable(str(exc)) from exc
            result = gate(
                output,
                decision,
                ids=self.ids,
                state=prepared.state,
                policy=self.policy,
                scope=self.scope,
                analysis=self.analysis,
                metadata=self.metadata,
                origins=prepared.origins,
            )
            if universe:
                result.facts["populations"] = universe
            self.commit = commit_for(files, self.scope, pointer, result, prepared)
        except AuditUnavailable as exc:
            raise Unavailable(
                f"the query-set audit could not run ({exc}); retry the same reveal later",
                code="audit_unavailable",
            ) from exc
        self.facts = result.facts
        return result.decision

    def release(self) -> None:
        """Give up the scope's lock (after the step is recorded, or on failure)."""
        if self._held:
            self._held = False
            self._lock.release()
        if self.commit is not None:
            self.auditor.files.prune(self.scope, self.commit.digest)
