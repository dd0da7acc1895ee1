"""Output checkers' decisions: steps the rules (or a script) sent to human review, and openings of
sequences past a researcher's withhold budget."""

from __future__ import annotations

from dataclasses import dataclass

from safeaccess.rules.decision import Decision
from safeaccess.server.errors import Conflict, NotFound
from safeaccess.server.pipeline import sha256_hex
from safeaccess.server.store import Store


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


def pending(store: Store) -> list[PendingReview]:
    """Steps waiting for an output checker, oldest first, with the rules' full findings."""
    items = []
    for seq, step in store.review_queue():
        decision = Decision.model_validate(step.decision) if step.decision else None
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
            )
        )
    return items


def decide(
    store: Store, sequence_id: str, index: int, *, approve: bool, reviewer: str, note: str = ""
) -> str:
    """Release (approve) or withhold (reject, which aborts the sequence) a step in review;
    returns the sequence's new state. The note is the message the researcher sees."""
    step = store.get_step(sequence_id, index)
    if step is None:
        raise NotFound(f"step {index} of sequence {sequence_id} does not exist")
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
    seq, _ = store.decide_review(
        sequence_id,
        index,
        approve=approve,
        reviewer=reviewer,
        note=note,
        event_data={
            "ruleset_sha256": step.ruleset_hash,
            "verdict": "release" if approve else "withhold",
            "note_sha256": sha256_hex(note.encode("utf-8")),
        },
    )
    return seq.state


def openings(store: Store) -> list[PendingOpening]:
    """Sequences waiting for approval to open (past the withhold budget), oldest first."""
    items = []
    for seq, dataset in store.openings_waiting():
        opened = next((e for e in store.events(seq.id) if e.kind == "sequence_opened"), None)
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
    store: Store, sequence_id: str, *, approve: bool, reviewer: str, note: str = ""
) -> str:
    """Approve (the researcher's next reveal runs step 1) or reject (abort) opening a sequence
    past the withhold budget; returns the sequence's new state."""
    seq, _ = store.decide_opening(
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
