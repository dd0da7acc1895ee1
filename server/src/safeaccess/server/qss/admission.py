"""Query-set admission of one step, from the scope's lock to the recorded step: one owner.

The sandbox runs outside any lock. Once the rules have checked the output, `Admission.admit`
reads the scope's state pointer and admits the output or refuses it (`qss_gate.gate`), writing
an admitted state's file, *without* the scope's lock: one researcher's long admission never
makes a colleague's step in the scope wait for it. It then takes the lock and keeps that
decision only if the scope's state has not moved meanwhile (the pointer it started from is
still the current one); if it has, it decides again against the new state (once more without
the lock, then under it). The decision under the lock is bounded by the auditor's guard
(`rules/qss/guard.py`), so others wait seconds at most. The lock is then held until the step
and the pointer's move are recorded in one transaction (`Admission.settle`). Before the output, the
state admits the populations of the dataset's versions it has not decided yet
(`qss_universe`): their row counts are published, so they are released before anything else.

The scope's lock is an in-process lock and, on PostgreSQL, also the scope's advisory lock
(`store.advisory_locks`), so replicas sharing the database admit one at a time per scope; the
second waits and then reads the state the first committed. As a backstop (SQLite files opened by
several processes), the store reads the pointer row `FOR UPDATE` when the step is recorded and
refuses (`qss_state_changed`) if another admission moved it; `settle` then admits the same
checked output again against the new state, without re-running the sandbox, and records that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.decision import Decision
from safeaccess.rules.outputs import Output
from safeaccess.rules.qss.guard import Interrupted
from safeaccess.server.config import QssSettings, scope_key
from safeaccess.server.errors import Conflict, Unavailable
from safeaccess.server.outcome import VERDICT_STATE, QssCommit, QssPointer, StepOutcome
from safeaccess.server.qss.gate import AuditUnavailable, Gate, commit_for, gate, policy_for
from safeaccess.server.qss.scope import ScopeAuditor
from safeaccess.server.qss.universe import (
    Population,
    PopulationUnavailable,
    admit_populations,
    records_needed,
)

log = logging.getLogger("safeaccess.server")

#: Decisions made without the scope's lock before one is made under it (each is discarded
#: when another step of the scope was recorded while it ran).
UNLOCKED_ATTEMPTS = 2
#: How many times a step is recorded before a moved scope state is an error: a second
#: admission in between needs two processes admitting in one scope without a shared lock.
SETTLE_ATTEMPTS = 3

T = TypeVar("T")
#: Records a step: given its outcome, the scope's state move (None when nothing was admitted)
#: and the auditor's facts for the log; raises `Conflict("qss_state_changed")` if the state
#: moved since the admission.
Record = Callable[[StepOutcome, QssCommit | None, dict[str, Any]], T]


def with_decision(outcome: StepOutcome, decision: Decision) -> StepOutcome:
    """The same outcome under another decision (admitted again against a newer state)."""
    return replace(
        outcome,
        state=VERDICT_STATE[decision.verdict],
        decision=decision.model_dump(mode="json"),
        ruleset_hash=decision.ruleset_hash,
    )


class Admission:
    """The query-set admission of one step: pass `admit` to the pipeline as its audit, record
    the step through `settle`, and `release` in every case (or use it as a context manager)."""

    def __init__(
        self,
        auditor: ScopeAuditor,
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
    ):
        """The admission of one step on a version whose positions map to `ids`;
        `populations` lists every registered version's population (read when the step is
        admitted); `analysis` and `metadata` define the step's query sets on the domain grid."""
        self.auditor = auditor
        self.scope = scope_key(dataset, settings.scope, researcher=researcher, project=project)
        self.policy = policy_for(settings, threshold)
        self.ids = ids
        self.populations: Callable[[], Sequence[Population]] = populations
        if settings.scope == "researcher":
            # A researcher's own scope holds only her releases, so no colleague's release can
            # make her table the refused one: the reserved standard tables (`reserved.py`) would
            # only refuse her ordinary subsets of them (a mean over the present incomes per
            # region after the reserved region counts isolates the few missing ones).
            self.populations = lambda: [replace(p, reserved=()) for p in populations()]
        self.analysis = analysis
        self.metadata = metadata
        self.commit: QssCommit | None = None
        self._pointer: QssPointer | None = None  # the scope's pointer the admission started from
        self.facts: dict[str, Any] = {}
        self._lock = auditor.lock(self.scope)
        self._held = False
        self._checked: tuple[Output, Decision] | None = None
        self._recorded = False

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def admit(self, output: Output, decision: Decision) -> Decision:
        """The pipeline's audit: admit the checked output and its decision against the scope's
        state, and take the scope's lock (kept until `release`); the final decision. The
        decision is made without the lock and kept if the state did not move meanwhile."""
        self._checked = (output, decision)
        if not self._held:
            for _ in range(UNLOCKED_ATTEMPTS):
                decided = self._gate()
                self._lock.acquire()
                self._held = True
                if self.auditor.pointer(self.scope) == self._pointer:
                    return decided
                # another step of the scope was recorded meanwhile: decide again on its state
                self._held = False
                self._lock.release()
            self._lock.acquire()
            self._held = True
        return self._gate()

    def _gate(self) -> Decision:
        """Admit the checked output against the scope's current state."""
        assert self._checked is not None
        output, decision = self._checked
        files = self.auditor.files
        pointer = self._pointer = self.auditor.pointer(self.scope)
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
            if self.commit is None and universe:
                # The populations and reserved tables decided before a withheld output are
                # kept all the same (they come before any output): otherwise every withheld
                # step of a new scope decided them again, and the reserved tables' admissions
                # made its refusals seconds slower than its releases.
                kept = Gate(result.decision, result.facts, prepared.state)
                self.commit = commit_for(files, self.scope, pointer, kept, prepared)
        except Interrupted as exc:
            # the process is stopping: nothing was decided, the step stays running and is run
            # again at the next start (steps/restart.py) or by another replica
            raise Unavailable(
                "the centre is stopping; retry the same reveal later", code="audit_unavailable"
            ) from exc
        except AuditUnavailable as exc:
            raise Unavailable(
                f"the query-set audit could not run ({exc}); retry the same reveal later",
                code="audit_unavailable",
            ) from exc
        self.facts = result.facts
        return result.decision

    def settle(self, outcome: StepOutcome, record: Record[T]) -> tuple[T, StepOutcome]:
        """Record the step (`record`) with the admission's state move; when another admission
        moved the scope's state meanwhile, admit the same output again and record that. The
        recorded value and the outcome as recorded."""
        for attempt in range(SETTLE_ATTEMPTS):
            try:
                recorded = record(outcome, self.commit, self.facts)
            except BaseException as exc:
                self.auditor.forget(self.scope)  # read the pointer again from now on
                if (
                    not isinstance(exc, Conflict)
                    or exc.code != "qss_state_changed"
                    or attempt == SETTLE_ATTEMPTS - 1
                ):
                    raise
                # Only when two processes admitted in one scope without a shared lock
                # (PostgreSQL replicas take the scope's advisory lock, so they never get here).
                log.warning(
                    "scope %s: the auditor state moved meanwhile; admitting again", self.scope
                )
                outcome = with_decision(outcome, self._gate())
                continue
            self._recorded = True
            if self.commit is not None:
                self.auditor.recorded(self.scope, self._pointer, self.commit)
            return recorded, outcome
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def release(self) -> None:
        """Give up the scope's lock (after the step is recorded, or on failure); once the step
        is recorded, queue its state's full file (`StateFiles.compact`) and prune old files."""
        if self._held:
            self._held = False
            self._lock.release()
        if self.commit is not None:
            files = self.auditor.files
            if self._recorded:
                # the full state of the recorded delta, written after the step (a thread):
                # the step never waits for it, and a cold load then reads it, not a chain
                files.compact(self.scope, self.commit.digest)
            files.prune(self.scope, self.commit.digest, self.commit.base)
