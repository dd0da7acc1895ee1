"""Certification-authority claims a dataset requires per analysis kind, and the gate that
enforces them when a sequence is opened and when each step is revealed.

A controller states, per dataset name (all its versions), that analyses of a kind run only in
sequences endorsed by a trusted CA with a claim (the policy the CA certified, e.g. `fair`).
The server never sees the bodies before they are revealed, so a sequence may declare its kinds
in its signed header (`kinds`):

- at open, every declared kind (and the kind of step 1) whose required claims the verified
  endorsements lack is refused, naming the claim and the kind;
- at each reveal, a step whose kind needs a missing claim, or whose kind the header does not
  declare when it declares any, is refused.

Refusals depend only on the signed header, the verified endorsements, the step's analysis and
this configuration — never on data — and are raised before anything is stored, so a refused
open leaves no sequence and a refused reveal leaves the sequence where it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from safeaccess.client.protocol import Endorsement
from safeaccess.server.errors import Forbidden, NotFound
from safeaccess.server.store import auditlog, catalogue, claims, step_settings
from safeaccess.server.store.database import Database

Requirements = Mapping[str, frozenset[str]]


# -- configuration -------------------------------------------------------------------------------


def requirements(store: Database, dataset: str) -> dict[str, frozenset[str]]:
    """kind -> the claims it needs on dataset `dataset` (empty: nothing required)."""
    scoped = step_settings.scoped_by_name(store, dataset)
    if scoped is not None:
        return scoped.requirements
    with store.transaction() as s:
        return claims.requirements(s, dataset)


def require_claim(
    store: Database, dataset: str, kind: str, claim: str, *, actor: str = "admin"
) -> bool:
    """Require `claim` for analyses of `kind` on `dataset`; False if it was already required.
    Logged in the audit log like every configuration change."""
    with store.transaction() as s:
        if not catalogue.dataset_known(s, dataset):
            raise NotFound(f"dataset {dataset!r} does not exist; add it with 'dataset add'")
        if not claims.add(s, dataset, kind, claim):
            return False
        auditlog.append(
            s, "claim_required", actor, {"dataset": dataset, "kind": kind, "claim": claim}
        )
    return True


def drop_claim(
    store: Database, dataset: str, kind: str, claim: str, *, actor: str = "admin"
) -> bool:
    """Stop requiring `claim` for `kind` on `dataset`; False if it was not required."""
    with store.transaction() as s:
        gone = claims.drop(s, dataset, kind, claim)
        if gone:
            auditlog.append(
                s, "claim_dropped", actor, {"dataset": dataset, "kind": kind, "claim": claim}
            )
    return gone


# -- enforcement --------------------------------------------------------------------------------


def granted_claims(endorsements: Iterable[Endorsement]) -> frozenset[str]:
    """The claims of verified endorsements: the policy each trusted CA certified."""
    return frozenset(
        policy for e in endorsements if isinstance(policy := e.claims.get("policy"), str)
    )


def claims_record(endorsements: Iterable[Endorsement]) -> list[dict[str, Any]]:
    """Per verified endorsement, the CA and its claims, for the audit log's open record."""
    return [{"ca": e.ca, "claims": dict(e.claims)} for e in endorsements]


def _missing(reqs: Requirements, kind: str, granted: frozenset[str]) -> list[str]:
    return sorted(reqs.get(kind, frozenset()) - granted)


def _refuse(dataset: str, kind: str, claims: list[str], where: str) -> Forbidden:
    names = ", ".join(repr(c) for c in claims)
    return Forbidden(
        f"dataset {dataset!r} requires the claim {names} from a trusted certification authority "
        f"for analyses of kind {kind!r}, which {where}; the sequence carries no valid "
        f"endorsement with it: have it certified (safeaccess ca certify --policy "
        f"{claims[0]}) before opening it",
        code="endorsement_required",
    )


def check_open(
    dataset: str,
    reqs: Requirements,
    declared: tuple[str, ...] | None,
    first_kind: str | None,
    granted: frozenset[str],
) -> None:
    """Refuse to open a sequence whose declared kinds, or step 1 (of kind `first_kind`, None
    for an invalid body), need a claim it lacks."""
    if not reqs and declared is None:
        return
    for kind in declared or ():
        missing = _missing(reqs, kind, granted)
        if missing:
            raise _refuse(dataset, kind, missing, "the sequence's header declares")
    check_step(dataset, reqs, declared, 1, first_kind, granted)


def check_step(
    dataset: str,
    reqs: Requirements,
    declared: tuple[str, ...] | None,
    index: int,
    kind: str | None,
    granted: frozenset[str],
) -> None:
    """Refuse step `index` if its kind needs a claim the sequence lacks, or if the header
    declares kinds and not this one. `kind` is the step's analysis kind (`Revealed.kind`); an
    invalid body (None) passes here and fails in the pipeline without running anything."""
    if not reqs and declared is None:
        return
    if kind is None:
        return
    if declared is not None and kind not in declared:
        raise Forbidden(
            f"step {index} is of kind {kind!r}, which the sequence's header does not declare "
            f"(it declares {', '.join(declared)}); a sequence may only use the kinds it "
            "declares",
            code="kind_not_declared",
        )
    missing = _missing(reqs, kind, granted)
    if missing:
        raise _refuse(dataset, kind, missing, f"step {index} is")
