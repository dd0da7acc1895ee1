"""Who may decide a step in review: the two-person rule per dataset and no self-review.

Shared by the admin CLI and the web workspace through `review.decide`, so both enforce the same
rules. A CLI `--reviewer` name counts as a checker: if a checker account of that name is linked to
a researcher identity, that identity is refused too.
"""

from __future__ import annotations

from typing import Any

from safeaccess.server.errors import Conflict, Forbidden, InvalidRequest, NotFound
from safeaccess.server.store import auditlog, catalogue, review, scripts, sequences
from safeaccess.server.store.database import Database
from safeaccess.server.store.schema import ReviewApprovalRow, SequenceRow

ALLOWED_CHECKERS = (1, 2)
#: A dataset whose two-person rule was never set needs one checker per release.
DEFAULT_CHECKERS = 1


def checkers_required(store: Database, dataset: str) -> int:
    """How many different checkers must approve a release on `dataset` (default 1)."""
    with store.transaction() as s:
        recorded = review.checkers_required(s, dataset)
    return recorded if recorded is not None else DEFAULT_CHECKERS


def set_checkers_required(store: Database, dataset: str, checkers: int, *, actor: str) -> None:
    """Set the two-person rule of a dataset (all versions); logged."""
    if checkers not in ALLOWED_CHECKERS:
        raise InvalidRequest(f"a dataset needs 1 or 2 checkers per release, not {checkers}")
    if catalogue.find_dataset(store, dataset) is None:
        raise NotFound(f"dataset {dataset} does not exist; see 'safeaccess-server dataset list'")
    with store.transaction() as s:
        review.set_checkers_required(s, dataset, checkers)
        auditlog.append(s, "review_settings", actor, {"dataset": dataset, "checkers": checkers})


def refuse_own_output(store: Database, seq: SequenceRow, checker: str) -> None:
    """Raise Forbidden when `checker` is the sequence's researcher (by name or by the researcher
    identity her checker account is linked to)."""
    with store.transaction() as s:
        linked = review.linked_researcher(s, checker)
    if checker == seq.researcher or (linked is not None and linked == seq.researcher):
        raise Forbidden(
            f"{checker} cannot review this output: it is the output of researcher "
            f"{seq.researcher}, and nobody reviews her own output; ask another checker",
            code="own_output",
        )


def first_approvals(store: Database, sequence_id: str, index: int) -> list[ReviewApprovalRow]:
    """The first approvals a step holds, oldest first."""
    with store.transaction() as s:
        return review.first_approvals(s, sequence_id, index)


def waiting_for_second(store: Database) -> set[tuple[str, int]]:
    """Steps that hold a first approval (and so wait for a second checker)."""
    with store.transaction() as s:
        return review.steps_with_first_approval(s)


def record_first_approval(
    store: Database,
    sequence_id: str,
    index: int,
    checker: str,
    mitigation: dict[str, Any] | None,
    event_data: dict[str, Any],
) -> None:
    """Keep a first approval and log it; the step stays in review. Refused when the step left
    review or another checker's approval landed meanwhile (two CLI processes, or the CLI and the
    web): then the caller's view was stale, and she decides again on the current state."""
    with store.transaction() as s:
        # The step's row lock serialises two checkers approving at once.
        step = sequences.find_step(s, sequence_id, index, lock=True)
        if step is None or step.state != "review":
            raise Conflict(f"step {index} of {sequence_id} is no longer in review")
        if review.count_first_approvals(s, sequence_id, index):
            raise Conflict(
                "another checker approved this step meanwhile; look at it again and decide"
            )
        scripts.append_script_run(s, step)
        review.add_first_approval(s, sequence_id, index, checker, mitigation)
        auditlog.append(
            s,
            "review_first_approval",
            checker,
            event_data,
            sequence_id=sequence_id,
            step_index=index,
        )


def log_view(store: Database, checker: str, sequence_id: str, index: int) -> None:
    """An output checker opened a step: who looked at which output, in the audit log."""
    with store.transaction() as s:
        step = sequences.find_step(s, sequence_id, index, lock=True)
        if step is not None and step.state == "review":
            scripts.append_script_run(s, step)
        auditlog.append(s, "review_viewed", checker, {}, sequence_id=sequence_id, step_index=index)
