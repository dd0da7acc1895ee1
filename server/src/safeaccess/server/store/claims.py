"""The claims a dataset requires per analysis kind (the rows behind
`safeaccess.server.steps.claims`, which enforces them). Each runs in the caller's transaction;
a step reads them with its dataset's other settings (`step_settings`)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from safeaccess.server.store.schema import ClaimRequirementRow


def _by_kind(pairs: list[tuple[str, str]]) -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = {}
    for kind, claim in pairs:
        found.setdefault(kind, set()).add(claim)
    return {kind: frozenset(claims) for kind, claims in found.items()}


def requirements(s: Session, dataset: str) -> dict[str, frozenset[str]]:
    """kind -> the claims it needs on dataset name `dataset` (empty: nothing required)."""
    rows = s.scalars(select(ClaimRequirementRow).where(ClaimRequirementRow.dataset == dataset))
    return _by_kind([(row.kind, row.claim) for row in rows])


def add(s: Session, dataset: str, kind: str, claim: str) -> bool:
    """Require `claim` for `kind` on `dataset`; False if it was already required."""
    if s.get(ClaimRequirementRow, (dataset, kind, claim)) is not None:
        return False
    s.add(ClaimRequirementRow(dataset=dataset, kind=kind, claim=claim))
    return True


def drop(s: Session, dataset: str, kind: str, claim: str) -> bool:
    """Stop requiring `claim` for `kind` on `dataset`; False if it was not required."""
    gone = s.execute(
        delete(ClaimRequirementRow)
        .where(ClaimRequirementRow.dataset == dataset)
        .where(ClaimRequirementRow.kind == kind)
        .where(ClaimRequirementRow.claim == claim)
    ).rowcount  # type: ignore[attr-defined]
    return bool(gone)
