"""Output checkers' decisions on steps the rules sent to human review."""

from __future__ import annotations

from dataclasses import dataclass

from safeaccess.rules.decision import Decision
from safeaccess.server.errors import NotFound
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
            )
        )
    return items


def decide(
    store: Store, sequence_id: str, index: int, *, approve: bool, reviewer: str, note: str = ""
) -> str:
    """Release (approve) or withhold (reject, which aborts the sequence) a step in review;
    returns the sequence's new state."""
    step = store.get_step(sequence_id, index)
    if step is None:
        raise NotFound(f"step {index} of sequence {sequence_id} does not exist")
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
