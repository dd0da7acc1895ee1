"""What a researcher sees of her steps and sequences: states, outputs, reasons, receipts.

Everything in a view is computable from what was released and from published metadata: a
withheld step shows the reasons `reasons.py` allows (or a DP refusal's own message, which
depends only on the request and the public ledger), a script step the same reason whatever its
run did.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.rules.decision import Decision
from safeaccess.rules.ruleset import RuleSet
from safeaccess.server.dp import public_reasons
from safeaccess.server.schemas import BudgetView, ErrorInfo, Reason, SequenceView, StepView
from safeaccess.server.states import SequenceState, StepState
from safeaccess.server.steps.reasons import researcher_reasons, script_reasons
from safeaccess.server.steps.receipts import sign_receipt
from safeaccess.server.steps.revealed import SCRIPT_KIND, Revealed, shown_of
from safeaccess.server.steps.withhold_budget import budget
from safeaccess.server.store import WithholdCount, catalogue, sequences
from safeaccess.server.store.database import Database
from safeaccess.server.store.schema import DatasetRow, SequenceRow, StepRow

AWAITING_APPROVAL = Reason(
    check="withhold_budget",
    verdict="review",
    message="your withhold budget on this dataset is spent: an output checker must approve "
    "opening this sequence; run it again once approved",
)


def utc(moment: datetime) -> datetime:
    """SQLite returns stored UTC times without their zone: the same moment must read the same
    whether it was just written or read back."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def shown_time(step: StepRow) -> datetime:
    """The time a researcher's view gives for a step: of the last action someone took on it.

    That is her reveal, or an output checker's decision. Never the moment the step settled:
    how long a run took depends on the data (a filter's selectivity, the query-set auditor's
    path), and a settle time to the microsecond, minus the moment she sent the reveal, reads
    it off with no network noise.
    """
    return utc(step.updated_at if step.reviewer else step.created_at)


def reasons(step: StepRow, decision: Decision | None) -> list[Reason]:
    """Why a step is not released, as the researcher may read it."""
    state = StepState(step.state)
    if state == StepState.PENDING:
        return [AWAITING_APPROVAL]
    if state not in (StepState.WITHHELD, StepState.REVIEW):
        return []
    if step.kind == SCRIPT_KIND:
        # Whatever the run did (output, crash, limit): the same reason, from the analysis.
        return script_reasons()
    if decision is None:
        return []
    # A DP budget or risk-limit withhold depends only on the request and the public ledger,
    # so its own message is shown; every other withhold goes through `reasons.py`.
    return public_reasons(decision) or researcher_reasons(decision)


class Views:
    """Builds step and sequence views, signing each step's receipt with the server's key."""

    def __init__(
        self,
        store: Database,
        signing_key: Ed25519PrivateKey,
        server_id: str,
        ruleset_for: Callable[[DatasetRow], RuleSet],
    ):
        self.store = store
        self.signing_key = signing_key
        self.server_id = server_id
        self.ruleset_for = ruleset_for

    def budget(self, seq: SequenceRow, used: int | None = None) -> BudgetView | None:
        """The researcher's withhold budget on the sequence's dataset (`used`: as in `budget`)."""
        dataset = catalogue.get_dataset(self.store, seq.dataset_id)
        return budget(self.store, self.ruleset_for(dataset), seq.researcher, dataset.name, used)

    def step(
        self,
        seq: SequenceRow,
        step: StepRow,
        revealed: Revealed | None = None,
        *,
        withholds: WithholdCount | None = None,
    ) -> StepView:
        """The researcher's view of a step; `revealed` is the step's parsed body when the step
        was just revealed (a stored step's body is read here); `withholds`, the budget's count
        when the step's settle made it."""
        state = StepState(step.state)
        decision = Decision.model_validate(step.decision) if step.decision else None
        analysis = revealed.shown if revealed is not None else shown_of(step.body)
        dataset = catalogue.get_dataset(self.store, seq.dataset_id)
        script = step.kind == SCRIPT_KIND
        return StepView(
            sequence_id=seq.id,
            index=step.index,
            dataset=dataset.name,
            dataset_version=dataset.version,
            state=state.value,
            last=step.last,
            kind=step.kind,
            analysis=analysis,
            output=step.public_output if state == StepState.RELEASED else None,
            reasons=reasons(step, decision),
            error=(
                ErrorInfo(code=step.error_code or "failed", message=step.error_message or "")
                if state == StepState.FAILED
                else None
            ),
            # A script's decision appears only when its run ends: not the researcher's to see.
            ruleset=decision.ruleset if decision and not script else None,
            ruleset_hash=(
                step.ruleset_hash if script else decision.ruleset_hash if decision else None
            ),
            sequence_state=seq.state,
            updated_at=shown_time(step),
            receipt=sign_receipt(self.signing_key, self.server_id, seq, step),
            review_note=step.review_note if step.reviewer else None,
            withhold_budget=self.budget(seq, None if withholds is None else withholds.used),
        )

    def sequence(self, seq: SequenceRow) -> SequenceView:
        """The researcher's view of a sequence and every step revealed so far."""
        dataset = catalogue.get_dataset(self.store, seq.dataset_id)
        steps = sequences.steps(self.store, seq.id)
        return SequenceView(
            id=seq.id,
            header_sha256=seq.header_hash,
            researcher=seq.researcher,
            project=seq.project,
            dataset=dataset.name,
            dataset_version=dataset.version,
            state=SequenceState(seq.state).value,
            current_index=seq.current_index,
            created_at=utc(seq.created_at),
            # Its steps' times, not the sequence row's: that row changes when a step settles.
            updated_at=max((shown_time(s) for s in steps), default=utc(seq.created_at)),
            steps=[self.step(seq, s) for s in steps],
            withhold_budget=self.budget(seq),
        )
