"""Who may decide a step in review: the two-person rule per dataset and no self-review.

Shared by the admin CLI and the web workspace through `review.decide`, so both enforce the same
rules. A CLI `--reviewer` name counts as a checker: if a checker account of that name is linked to
a researcher identity, that identity is refused too.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from safeaccess.server import auditlog
from safeaccess.server.errors import Conflict, Forbidden, InvalidRequest, NotFound
from safeaccess.server.store import Store
from safeaccess.server.store.schema import (
    CheckerRow,
    ReviewApprovalRow,
    ReviewSettingsRow,
    SequenceRow,
    StepRow,
)

ALLOWED_CHECKERS = (1, 2)


def checkers_required(store: Store, dataset: str) -> int:
    """How many different checkers must approve a release on `dataset` (default 1)."""
    with store.transaction() as s:
        row = s.get(ReviewSettingsRow, dataset)
        return row.checkers if row is not None else 1


def set_checkers_required(store: Store, dataset: str, checkers: int, *, actor: str) -> None:
    """Set the two-person rule of a dataset (all versions); logged."""
    if checkers not in ALLOWED_CHECKERS:
        raise InvalidRequest(f"a dataset needs 1 or 2 checkers per release, not {checkers}")
    if store.find_dataset(dataset) is None:
        raise NotFound(f"dataset {dataset} does not exist; see 'safeaccess-server dataset list'")
    with store.transaction() as s:
        row = s.get(ReviewSettingsRow, dataset)
        if row is None:
            s.add(ReviewSettingsRow(dataset=dataset, checkers=checkers))
        else:
            row.checkers = checkers
        auditlog.append(s, "review_settings", actor, {"dataset": dataset, "checkers": checkers})


def refuse_own_output(store: Store, seq: SequenceRow, checker: str) -> None:
    """Raise Forbidden when `checker` is the sequence's researcher (by name or by the researcher
    identity her checker account is linked to)."""
    with store.transaction() as s:
        row = s.get(CheckerRow, checker)
        linked = row.researcher if row is not None else None
    if checker == seq.researcher or (linked is not None and linked == seq.researcher):
        raise Forbidden(
            f"{checker} cannot review this output: it is the output of researcher "
            f"{seq.researcher}, and nobody reviews her own output; ask another checker",
            code="own_output",
        )


def first_approvals(store: Store, sequence_id: str, index: int) -> list[ReviewApprovalRow]:
    with store.transaction() as s:
        query = (
            select(ReviewApprovalRow)
            .where(
                ReviewApprovalRow.sequence_id == sequence_id,
                ReviewApprovalRow.step_index == index,
            )
            .order_by(ReviewApprovalRow.at)
        )
        return list(s.scalars(query))


def waiting_for_second(store: Store) -> set[tuple[str, int]]:
    """Steps that hold a first approval (and so wait for a second checker)."""
    with store.transaction() as s:
        rows = s.execute(select(ReviewApprovalRow.sequence_id, ReviewApprovalRow.step_index))
        return {(r[0], r[1]) for r in rows}


def record_first_approval(
    store: Store,
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
        step = s.scalars(
            select(StepRow)
            .where(StepRow.sequence_id == sequence_id, StepRow.index == index)
            .with_for_update()
        ).first()
        if step is None or step.state != "review":
            raise Conflict(f"step {index} of {sequence_id} is no longer in review")
        others = s.scalar(
            select(func.count())
            .select_from(ReviewApprovalRow)
            .where(
                ReviewApprovalRow.sequence_id == sequence_id,
                ReviewApprovalRow.step_index == index,
            )
        )
        if others:
            raise Conflict(
                "another checker approved this step meanwhile; look at it again and decide"
            )
        Store.append_script_run(s, step)
        s.add(
            ReviewApprovalRow(
                sequence_id=sequence_id, step_index=index, checker=checker, mitigation=mitigation
            )
        )
        auditlog.append(
            s,
            "review_first_approval",
            checker,
            event_data,
            sequence_id=sequence_id,
            step_index=index,
        )


def log_view(store: Store, checker: str, sequence_id: str, index: int) -> None:
    """An output checker opened a step: who looked at which output, in the audit log."""
    with store.transaction() as s:
        step = s.scalars(
            select(StepRow)
            .where(StepRow.sequence_id == sequence_id, StepRow.index == index)
            .with_for_update()
        ).first()
        if step is not None and step.state == "review":
            Store.append_script_run(s, step)
        auditlog.append(s, "review_viewed", checker, {}, sequence_id=sequence_id, step_index=index)
