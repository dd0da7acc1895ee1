"""The claims a dataset requires per analysis kind (the rows behind
`safeaccess.server.steps.claims`, which enforces them). Each runs in the caller's transaction
(`requirements_of`, read on every step, on a Core connection)."""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, delete, select
from sqlalchemy.orm import Session

from safeaccess.server.store.schema import ClaimRequirementRow, DatasetRow


def _by_kind(pairs: list[tuple[str, str]]) -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = {}
    for kind, claim in pairs:
        found.setdefault(kind, set()).add(claim)
    return {kind: frozenset(claims) for kind, claims in found.items()}


def requirements(s: Session, dataset: str) -> dict[str, frozenset[str]]:
    """kind -> the claims it needs on dataset name `dataset` (empty: nothing required)."""
    rows = s.scalars(select(ClaimRequirementRow).where(ClaimRequirementRow.dataset == dataset))
    return _by_kind([(row.kind, row.claim) for row in rows])


def requirements_of(conn: Connection, dataset_id: int) -> dict[str, frozenset[str]]:
    """`requirements` of the dataset name of version `dataset_id`, in one query."""
    rows = conn.execute(_REQUIREMENTS_OF, {"dataset_id": dataset_id}).all()
    return _by_kind([(str(kind), str(claim)) for kind, claim in rows])


# Built once: read on every step's path.
_REQUIREMENTS_OF = (
    select(ClaimRequirementRow.kind, ClaimRequirementRow.claim)
    .join(DatasetRow, DatasetRow.name == ClaimRequirementRow.dataset)
    .where(DatasetRow.id == bindparam("dataset_id"))
)


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
