"""Persistence: every state change and its result in one database transaction.

`safeaccess.server.store` is the only package that speaks SQL. Its modules are named for their
job: `catalogue` (projects, researchers, auditors, datasets and their settings, nonces),
`sequences` (open, reveal, settle, listings), `ledgers` (DP ledgers and query-set pointers,
charged inside `settle_step`'s transaction), `review` (openings, the review queue, decisions,
first approvals), `scripts` (background script runs), `claims` (required CA claims), `queue`
(the job queue and its vocabulary), `accounts` (account listings and removal, checkers' web
accounts) and `log` (the audit log's rows). Callers import the module of the job they need and
give it the `Database` (`database.py`: the engine and `transaction()`), or a session of one of
its transactions.

`Store` is a `Database` with the few reads and writes that several callers above the steps
share (the service, the admin CLI, the web workspace, the demo, the benchmarks and the tests):
a delegate each, at most 25 (`tests/test_layers.py`). Nothing below the job layer imports it:
the steps, the query-set auditor, review, DP and the other layers under `jobs/` call the store's
modules directly, so a step's data goes down once and does not come back through here.

Each public function is one transaction: a step's outcome (state, output, decision, ruleset
hash) and the sequence's new state and the event row commit together or not at all. A step
recorded as `running` whose result never committed (a crash while the sandbox ran) is re-run
when the researcher retries the same reveal.
"""

from __future__ import annotations

from typing import Any

from safeaccess.server.config import QssSettings

# The outcome types moved to `safeaccess.server.outcome`; re-exported here until the layout
# change's last step (other branches still import them from the store).
from safeaccess.server.outcome import DPCharge as DPCharge
from safeaccess.server.outcome import DPLedgerState as DPLedgerState
from safeaccess.server.outcome import QssCommit as QssCommit
from safeaccess.server.outcome import QssPointer as QssPointer
from safeaccess.server.outcome import StepOutcome as StepOutcome
from safeaccess.server.store import (
    auditlog,
    catalogue,
    ledgers,
    log,
    sequences,
)
from safeaccess.server.store.database import Database as Database
from safeaccess.server.store.database import make_engine as make_engine
from safeaccess.server.store.review import OPENING_REJECTED as OPENING_REJECTED
from safeaccess.server.store.review import WithholdCount as WithholdCount
from safeaccess.server.store.schema import (
    DatasetRow,
    EventRow,
    ResearcherRow,
    SequenceRow,
    StepRow,
)


class Store(Database):
    """The reads and writes several callers above the steps share, each a delegate to the
    module of its job, over the `Database` (engine and transactions)."""

    # -- the audit log's rows -------------------------------------------------------------------

    def events(self, sequence_id: str | None = None) -> list[EventRow]:
        with self.transaction() as s:
            return log.events(s, sequence_id)

    def log_event(self, kind: str, actor: str, data: dict[str, Any]) -> int:
        """An administrative record on its own (configuration changes, auditors, ...)."""
        with self.transaction() as s:
            return auditlog.append(s, kind, actor, data)

    # -- catalogue: projects, researchers, auditors, datasets, nonces ---------------------------

    def add_project(self, name: str, *, actor: str = "admin") -> None:
        catalogue.add_project(self, name, actor=actor)

    def add_researcher(
        self,
        name: str,
        public_key_pem: str,
        fingerprint: str,
        projects: list[str],
        *,
        actor: str = "admin",
    ) -> None:
        """Register a researcher (or add projects to an existing one with the same key)."""
        catalogue.add_researcher(self, name, public_key_pem, fingerprint, projects, actor=actor)

    def key_status(self, key_fingerprint: str) -> dict[str, Any]:
        """What the log says about a key (see `catalogue.key_status`)."""
        return catalogue.key_status(self, key_fingerprint)

    def add_auditor(
        self, name: str, public_key_pem: str, fingerprint: str, *, actor: str = "admin"
    ) -> None:
        """Register an auditor (her key reaches the audit endpoints only)."""
        catalogue.add_auditor(self, name, public_key_pem, fingerprint, actor=actor)

    def get_researcher(self, name: str) -> ResearcherRow | None:
        return catalogue.get_researcher(self, name)

    def qss_settings(self, name: str) -> QssSettings:
        """The auditor settings of dataset `name` (the defaults if none were recorded)."""
        return catalogue.qss_settings(self, name)

    def get_dataset(self, dataset_id: int) -> DatasetRow:
        """A dataset version by id (read once, then from memory: versions are immutable)."""
        return catalogue.get_dataset(self, dataset_id)

    def find_dataset(self, name: str, version: int | None = None) -> DatasetRow | None:
        """A dataset by name: the given version, else the newest."""
        return catalogue.find_dataset(self, name, version)

    def get_dp_config(self, dataset: str) -> dict[str, Any] | None:
        return catalogue.get_dp_config(self, dataset)

    def set_dp_config(self, dataset: str, config: dict[str, Any], *, actor: str = "admin") -> None:
        """Enable or change DP on every version of `dataset` (its scope is fixed once charged)."""
        catalogue.set_dp_config(self, dataset, config, actor=actor)

    def remember_nonce(self, keyid: str, nonce: str, expires_at: int) -> bool:
        """Record a request nonce; False if it is already known (a replay)."""
        return catalogue.remember_nonce(self, keyid, nonce, expires_at)

    # -- sequences and steps --------------------------------------------------------------------

    def get_sequence(self, sequence_id: str) -> SequenceRow | None:
        return sequences.get_sequence(self, sequence_id)

    def list_sequences(self, researcher: str) -> list[SequenceRow]:
        return sequences.list_sequences(self, researcher)

    def steps(self, sequence_id: str) -> list[StepRow]:
        return sequences.steps(self, sequence_id)

    def get_step(self, sequence_id: str, index: int) -> StepRow | None:
        return sequences.get_step(self, sequence_id, index)

    def get_sequence_step(
        self, sequence_id: str, index: int
    ) -> tuple[SequenceRow | None, StepRow | None]:
        """A sequence and its step `index`, in one read (either None if it does not exist)."""
        return sequences.get_sequence_step(self, sequence_id, index)

    # -- DP ledgers and query-set pointers ------------------------------------------------------

    def qss_pointer(self, scope: str) -> QssPointer | None:
        return ledgers.qss_pointer(self, scope)

    def dp_ledger(self, key: str) -> DPLedgerState:
        return ledgers.dp_ledger(self, key)
