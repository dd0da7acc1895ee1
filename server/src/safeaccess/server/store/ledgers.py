"""The DP ledgers and the query-set auditor's state pointers.

`charge` and `move_qss_pointer` are session-level: `settle_step` calls them inside the step's
own transaction, so an answer and its charge (or the auditor state that admitted it) commit
together or not at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from safeaccess.server.errors import Conflict
from safeaccess.server.outcome import DPCharge, DPLedgerState, QssCommit, QssPointer
from safeaccess.server.store import auditlog
from safeaccess.server.store.schema import DPLedgerRow, QssStateRow, utcnow

if TYPE_CHECKING:
    from safeaccess.server.store.database import Database


def charge(s: Session, dp_charge: DPCharge) -> None:
    """Apply a DP charge to its ledger in this transaction; Conflict when the ledger moved
    since the charge was computed (its version, or its first row made meanwhile)."""
    row = s.get(DPLedgerRow, dp_charge.key, with_for_update=True)
    if row is None:
        if dp_charge.version != 0:
            raise Conflict("the privacy ledger changed; retry", code="concurrent_update")
        s.add(
            DPLedgerRow(
                key=dp_charge.key,
                dataset=dp_charge.dataset,
                scope=dp_charge.scope,
                owner=dp_charge.owner,
                spent=dp_charge.spent_after,
                releases=dp_charge.releases_after,
                version=1,
                updated_at=utcnow(),
            )
        )
        try:
            s.flush()
        except IntegrityError as exc:
            # Another process made the ledger's first row meanwhile (it did not exist when
            # this transaction looked): the same stale charge as a changed version.
            raise Conflict(
                "the privacy ledger changed while this step ran; retry the same reveal",
                code="concurrent_update",
            ) from exc
        return
    result = s.execute(
        update(DPLedgerRow)
        .where(DPLedgerRow.key == dp_charge.key, DPLedgerRow.version == dp_charge.version)
        .values(
            spent=dp_charge.spent_after,
            releases=dp_charge.releases_after,
            version=dp_charge.version + 1,
            updated_at=utcnow(),
        )
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict(
            "the privacy ledger changed while this step ran; retry the same reveal",
            code="concurrent_update",
        )


def charge_public_ledger(
    store: Database, dp_charge: DPCharge, *, event_data: dict[str, Any], actor: str = "admin"
) -> None:
    """Charge a dataset's public ledger (a mock) and record it, in one transaction."""
    with store.transaction() as s:
        charge(s, dp_charge)
        kind = "mock_published" if event_data.get("published") else "mock_generated"
        auditlog.append(s, kind, actor, {"dataset": dp_charge.dataset, **event_data})


def dp_ledger(store: Database, key: str) -> DPLedgerState:
    """The state of one DP ledger (an empty one if it was never charged)."""
    with store.transaction() as s:
        row = s.get(DPLedgerRow, key)
        if row is None:
            return DPLedgerState()
        return DPLedgerState(spent=row.spent, releases=row.releases, version=row.version)


def dp_ledgers(store: Database, dataset: str) -> list[DPLedgerRow]:
    """Every DP ledger of dataset `dataset`, by key."""
    with store.transaction() as s:
        query = select(DPLedgerRow).where(DPLedgerRow.dataset == dataset)
        return list(s.scalars(query.order_by(DPLedgerRow.key)))


def qss_pointer(store: Database, scope: str) -> QssPointer | None:
    """Where the auditor state of `scope` points now (None before its first admission)."""
    with store.one_statement() as conn:
        row = conn.execute(_POINTER, {"p_scope": scope}).first()
    if row is None:
        return None
    return QssPointer(digest=row.digest, n_records=row.n_records, admitted=row.admitted)


def move_qss_pointer(s: Session, commit: QssCommit) -> None:
    """Point the scope at the state that admitted a step, in this transaction; Conflict when
    another admission moved it since `commit.base` was read."""
    conn = s.connection()
    now = utcnow()
    if commit.base is None:
        # The scope's first pointer: a pointer made meanwhile by another admission makes this
        # INSERT fail on the primary key, which `settle_step` reports as the same Conflict.
        conn.execute(
            _INSERT_POINTER,
            {"scope": commit.scope, "digest": commit.digest, "n": commit.n_records, "now": now},
        )
        return
    # One guarded UPDATE reads and moves the pointer: on PostgreSQL a second replica admitting
    # against the same scope waits for the row's lock and then matches nothing (the digest
    # moved); on SQLite the transaction's write lock serialises it.
    moved = conn.execute(
        _MOVE_POINTER,
        {
            "p_scope": commit.scope,
            "base": commit.base,
            "new_digest": commit.digest,
            "n": commit.n_records,
            "now": now,
        },
    )
    if moved.rowcount != 1:
        raise Conflict(
            "the query-set audit state changed while this step was checked",
            code="qss_state_changed",
        )


_POINTERS: Table = QssStateRow.__table__  # type: ignore[assignment]
# Built once: statement construction costs more than executing them on the step's path.
_INSERT_POINTER = insert(_POINTERS).values(
    scope=bindparam("scope"),
    digest=bindparam("digest"),
    n_records=bindparam("n"),
    admitted=1,
    updated_at=bindparam("now", type_=_POINTERS.c.updated_at.type),
)
_POINTER = select(_POINTERS.c.digest, _POINTERS.c.n_records, _POINTERS.c.admitted).where(
    _POINTERS.c.scope == bindparam("p_scope")
)
_MOVE_POINTER = (
    update(_POINTERS)
    .where(_POINTERS.c.scope == bindparam("p_scope"), _POINTERS.c.digest == bindparam("base"))
    .values(
        digest=bindparam("new_digest"),
        n_records=bindparam("n"),
        admitted=_POINTERS.c.admitted + 1,
        updated_at=bindparam("now", type_=_POINTERS.c.updated_at.type),
    )
)
