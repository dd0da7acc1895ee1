"""Output checkers' decisions: steps the rules (or a script) sent to human review, and openings of
sequences past a researcher's withhold budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from safeaccess.rules.decision import Decision
from safeaccess.rules.mitigation import MitigationError, mitigate
from safeaccess.rules.outputs import Output, public
from safeaccess.rules.ruleset import RuleSet
from safeaccess.server.digests import sha256_hex
from safeaccess.server.errors import Conflict, InvalidRequest, NotFound
from safeaccess.server.review import rules as review_rules
from safeaccess.server.store import catalogue, log, review, sequences
from safeaccess.server.store.database import Database
from safeaccess.server.store.schema import StepRow


@dataclass(frozen=True)
class PendingReview:
    sequence_id: str
    index: int
    researcher: str
    project: str
    kind: str | None
    findings: list[str]
    waiting_since: str
    run: str | None = None  # scripts: how the background run went (checkers only)
    dataset: str = ""
    approved_by: tuple[str, ...] = ()  # first approvals (two-person rule)
    checkers_required: int = 1


@dataclass(frozen=True)
class PendingOpening:
    sequence_id: str
    researcher: str
    project: str
    dataset: str
    budget: dict[str, object] | None
    waiting_since: str


def script_run_state(
    output: object, error_code: str | None, error_message: str | None, wall_seconds: float | None
) -> str:
    """A script step's run as an output checker sees it."""
    took = f" in {wall_seconds:.1f} s" if wall_seconds is not None else ""
    if error_code:
        return f"failed{took}: {error_code} ({error_message or 'no message'})"
    if output is not None:
        return f"finished{took}"
    return "not run yet (queued or running)"


def pending(store: Database) -> list[PendingReview]:
    """Steps waiting for an output checker, oldest first, with the rules' full findings."""
    items = []
    datasets: dict[int, str] = {}
    for seq, step in review.review_queue(store):
        decision = Decision.model_validate(step.decision) if step.decision else None
        if seq.dataset_id not in datasets:
            datasets[seq.dataset_id] = catalogue.get_dataset(store, seq.dataset_id).name
        dataset = datasets[seq.dataset_id]
        items.append(
            PendingReview(
                sequence_id=seq.id,
                index=step.index,
                researcher=seq.researcher,
                project=seq.project,
                kind=step.kind,
                findings=[
                    f"{f.check} ({f.verdict}){' [' + f.item + ']' if f.item else ''}: {f.message}"
                    for f in (decision.findings if decision else [])
                ],
                waiting_since=step.updated_at.isoformat(),
                run=(
                    script_run_state(
                        step.output, step.error_code, step.error_message, step.wall_seconds
                    )
                    if step.kind == "script"
                    else None
                ),
                dataset=dataset,
                approved_by=tuple(
                    a.checker for a in review_rules.first_approvals(store, seq.id, step.index)
                ),
                checkers_required=review_rules.checkers_required(store, dataset),
            )
        )
    return items


@dataclass(frozen=True)
class Mitigation:
    """Suppression and/or rounding an output checker applies to a table when approving it."""

    suppress: bool = False
    round_to: int | None = None

    def as_json(self) -> dict[str, object]:
        return {"suppress": self.suppress, "round_to": self.round_to}

    @property
    def empty(self) -> bool:
        return not self.suppress and self.round_to is None


def _mitigated_public_output(
    step: StepRow, mitigation: Mitigation, ruleset: RuleSet | None
) -> dict[str, Any]:
    """The researcher's output of a table after the checker's suppression/rounding."""
    if step.output is None:
        raise Conflict("this step has no output to mitigate")
    output = TypeAdapter(Output).validate_python(step.output)
    try:
        mitigated = mitigate(
            output,
            ruleset,
            round_to=mitigation.round_to,
            suppress=mitigation.suppress,
            suppress_review=True,
        )
    except MitigationError as exc:
        raise Conflict(f"cannot apply this mitigation: {exc}") from exc
    return public(mitigated)


def decide(
    store: Database,
    sequence_id: str,
    index: int,
    *,
    approve: bool,
    reviewer: str,
    note: str = "",
    mitigation: Mitigation | None = None,
    ruleset: RuleSet | None = None,
) -> str:
    """Release (approve) or withhold (reject, which aborts the sequence) a step in review;
    returns the sequence's new state. The note is the message the researcher sees.

    The one code path of every checker decision (CLI and web): nobody decides on her own output;
    a rejection needs a note; on a dataset that needs two checkers the first approval is kept and
    the step stays in review until a different checker approves (either may reject). With
    `mitigation` the released output is the table with the suppression/rounding applied
    (`ruleset` is the dataset's, which decides what primary suppression removes)."""
    step = sequences.get_step(store, sequence_id, index)
    seq = sequences.get_sequence(store, sequence_id)
    if step is None or seq is None:
        raise NotFound(f"step {index} of sequence {sequence_id} does not exist")
    if not reviewer:
        raise InvalidRequest("a review decision needs the reviewer's name")
    review_rules.refuse_own_output(store, seq, reviewer)
    if step.state != "review":
        raise Conflict(f"step {index} of {sequence_id} is {step.state}, not in review")
    if not approve and not note.strip():
        raise InvalidRequest(
            "a rejection needs a comment: it is what the researcher receives with the decision"
        )
    if mitigation is not None and mitigation.empty:
        mitigation = None
    if approve and step.kind == "script":
        if step.error_code:
            raise Conflict(
                f"the script of step {index} failed ({step.error_code}); there is nothing to "
                "release: reject it (with a note for the researcher if you wish)"
            )
        if step.output is None:
            raise Conflict(
                f"the script of step {index} has not finished running; look at it again later"
            )
    dataset = catalogue.get_dataset(store, seq.dataset_id)
    required = review_rules.checkers_required(store, dataset.name)
    earlier = review_rules.first_approvals(store, sequence_id, index)
    checkers = [a.checker for a in earlier]
    public_output: dict[str, Any] | None = None
    if approve:
        if reviewer in checkers:
            raise Conflict(
                f"{reviewer} already approved step {index}; the two-person rule needs a "
                "different checker to approve it"
            )
        if earlier:
            chosen = earlier[0].mitigation
            mine = mitigation.as_json() if mitigation is not None else None
            if chosen != mine:
                raise Conflict(
                    f"{checkers[0]} approved this step with mitigation {chosen or 'none'}; "
                    "approve it with the same, or reject it"
                )
        if mitigation is not None:
            # Checked now, so a first approval can never name a mitigation that cannot apply.
            public_output = _mitigated_public_output(step, mitigation, ruleset)
        if len(checkers) + 1 < required:
            review_rules.record_first_approval(
                store,
                sequence_id,
                index,
                reviewer,
                mitigation.as_json() if mitigation is not None else None,
                {
                    "ruleset_sha256": step.ruleset_hash,
                    "review": {
                        "checkers_required": required,
                        "mitigation": mitigation.as_json() if mitigation is not None else None,
                    },
                    "note_sha256": sha256_hex(note.encode("utf-8")),
                },
            )
            return seq.state
    seq, _ = review.decide_review(
        store,
        sequence_id,
        index,
        approve=approve,
        reviewer=reviewer,
        note=note,
        event_data={
            "ruleset_sha256": step.ruleset_hash,
            "verdict": "release" if approve else "withhold",
            "note_sha256": sha256_hex(note.encode("utf-8")),
            "review": {
                "checkers_required": required,
                "approved_by": [*checkers, reviewer] if approve else checkers,
                "mitigation": mitigation.as_json() if mitigation is not None else None,
            },
        },
        public_output=public_output,
    )
    return seq.state


def openings(store: Database) -> list[PendingOpening]:
    """Sequences waiting for approval to open (past the withhold budget), oldest first."""
    items = []
    for seq, dataset in review.openings_waiting(store):
        with store.transaction() as s:
            events = log.events(s, seq.id)
        opened = next((e for e in events if e.kind == "sequence_opened"), None)
        facts = opened.data.get("withhold_budget") if opened is not None else None
        items.append(
            PendingOpening(
                sequence_id=seq.id,
                researcher=seq.researcher,
                project=seq.project,
                dataset=f"{dataset.name}@{dataset.version}",
                budget=facts if isinstance(facts, dict) else None,
                waiting_since=seq.created_at.isoformat(),
            )
        )
    return items


def decide_opening(
    store: Database, sequence_id: str, *, approve: bool, reviewer: str, note: str = ""
) -> str:
    """Approve (the researcher's next reveal runs step 1) or reject (abort) opening a sequence
    past the withhold budget; returns the sequence's new state. Nobody decides on her own
    sequence."""
    seq = sequences.get_sequence(store, sequence_id)
    if seq is None:
        raise NotFound(f"sequence {sequence_id} does not exist")
    review_rules.refuse_own_output(store, seq, reviewer)
    if not approve and not note.strip():
        raise InvalidRequest(
            "a rejection needs a comment: it is what the researcher receives with the decision"
        )
    seq, _ = review.decide_opening(
        store,
        sequence_id,
        approve=approve,
        reviewer=reviewer,
        note=note,
        event_data={
            "withhold_budget": {"decision": "approve" if approve else "reject"},
            "note_sha256": sha256_hex(note.encode("utf-8")),
        },
    )
    return seq.state
