"""What a step's pipeline decided, as the store records it: the outcome and its DP and QSS parts.

`StepOutcome` travels from the pipeline to `sequences.settle_step`, which writes it (with the DP
charge and the auditor state's pointer move) in one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from safeaccess.server.states import StepState

#: The step state of each verdict of a decision.
VERDICT_STATE = {
    "release": StepState.RELEASED,
    "withhold": StepState.WITHHELD,
    "review": StepState.REVIEW,
}


@dataclass(frozen=True)
class StepOutcome:
    """What the pipeline decided for one step, recorded atomically by `settle_step`."""

    state: StepState
    kind: str | None = None
    output: dict[str, Any] | None = None
    public_output: dict[str, Any] | None = None
    output_hash: str | None = None
    decision: dict[str, Any] | None = None
    ruleset_hash: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    backend: str | None = None
    wall_seconds: float | None = None
    dp_charge: DPCharge | None = None  # written to the scope's ledger with the release
    dp_facts: dict[str, Any] | None = None  # for the event log (`event_data["dp"]`)

    @classmethod
    def invalid(cls, kind: str, message: str) -> StepOutcome:
        """The step failed before it ran: its analysis cannot be answered (`message` says
        why and what to change)."""
        return cls(
            state=StepState.FAILED, kind=kind, error_code="invalid_analysis", error_message=message
        )


@dataclass(frozen=True)
class DPCharge:
    """A DP release's charge to its scope's ledger, written with the step's outcome.

    `spent_before` / `version` are what the charge was computed against: if the ledger moved
    meanwhile (another replica released in the same scope) the whole settle fails and the step
    stays re-runnable, so no answer leaves on a budget check that no longer holds.
    """

    key: str
    dataset: str
    scope: str
    owner: str
    version: int
    spent_after: float
    releases_after: int


@dataclass(frozen=True)
class DPLedgerState:
    spent: float = 0.0
    releases: int = 0
    version: int = 0


@dataclass(frozen=True)
class QssPointer:
    """Where a scope's current auditor state is: its file's digest and size."""

    digest: str
    n_records: int
    admitted: int


@dataclass(frozen=True)
class QssCommit:
    """A new auditor state to point a scope at, committed with the step that produced it.

    `base` is the digest the admission started from (None: the scope had no state); the commit
    fails with a `qss_state_changed` conflict if another admission moved the pointer meanwhile."""

    scope: str
    base: str | None
    digest: str
    n_records: int
