"""The audit log's rows: the head (its size) and the entries, each with the Merkle nodes it keeps.

Only SQL lives here; what the rows mean (record encoding, which nodes a new leaf completes,
roots and proofs) is `safeaccess.server.store.auditlog`. Every function runs in the caller's
transaction, so a record exists exactly when the change it records committed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Table, bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from safeaccess.server.store.schema import AuditHeadRow, EventRow

HEAD_ID = 1
#: Bytes of one node hash (SHA-256) in an entry's `merkle`.
HASH = 32
_HEAD: Table = AuditHeadRow.__table__  # type: ignore[assignment]
_EVENTS: Table = EventRow.__table__  # type: ignore[assignment]
# Built once: statement construction costs more than executing them on the append path.
# The reserve also returns the hashes kept by the entry before the reserved ones, its leaf first
# (NULL when there is none, or when the database's snapshot of this statement does not show it
# yet): what an appender's kept frontier is checked against (`store/frontier.py`).
_PREVIOUS_LEAF = (
    select(_EVENTS.c.merkle)
    .where(_EVENTS.c.log_index == _HEAD.c.size - bindparam("n") - 1)
    .scalar_subquery()
)
_RESERVE = (
    update(_HEAD)
    .where(_HEAD.c.id == HEAD_ID)
    .values(size=_HEAD.c.size + bindparam("n"))
    .returning(_HEAD.c.size, _PREVIOUS_LEAF)
)
_INSERT_EVENTS = insert(_EVENTS)
_MERKLE = select(_EVENTS.c.log_index, _EVENTS.c.merkle).where(
    _EVENTS.c.log_index.in_(bindparam("rows", expanding=True))
)
#: Entries per query: well under every database's bound-parameter limit.
_CHUNK = 500


def keeper(level: int, idx: int) -> int:
    """The index of the entry whose `merkle` keeps node (`level`, `idx`): its last leaf."""
    return ((idx + 1) << level) - 1


def completed(index: int) -> int:
    """How many levels above its leaf the entry at `index` completes (its trailing 1 bits)."""
    return ((index ^ (index + 1)).bit_length()) - 1


def node_of(merkle: bytes | None, level: int) -> bytes | None:
    """The node at `level` kept in an entry's `merkle` (None when it is not there whole)."""
    if merkle is None:
        return None
    found = bytes(merkle[level * HASH : (level + 1) * HASH])
    return found if len(found) == HASH else None


def first_damaged(conn: Connection, size: int) -> tuple[int, str] | None:
    """The first of entries 0..size-1 whose row is missing or keeps fewer nodes than an append
    stores for it, and which (None: none). A pass over the log, made only once a root or proof
    found a node missing, to name the first bad entry as an auditor's verifier would."""
    query = (
        select(_EVENTS.c.log_index, func.length(_EVENTS.c.merkle))
        .where(_EVENTS.c.log_index >= 0, _EVENTS.c.log_index < size)
        .order_by(_EVENTS.c.log_index)
    )
    missing = "missing from the server's store (its row was deleted or moved)"
    expected = 0
    for index, length in conn.execute(query):
        if index != expected:
            return expected, missing
        if (length or 0) < HASH * (completed(index) + 1):
            return index, (
                "not written by the server: its row lacks the Merkle hashes every append "
                "stores (a row inserted or edited under the server)"
            )
        expected += 1
    return (expected, missing) if expected < size else None


def ensure_head(session: Session) -> None:
    """Create the size row of an empty log (idempotent; a concurrent creator may win)."""
    if session.get(AuditHeadRow, HEAD_ID) is None:
        try:
            with session.begin_nested():
                session.add(AuditHeadRow(id=HEAD_ID, size=0))
        except IntegrityError:
            pass


def reserve(conn: Connection, n: int) -> tuple[int, bytes | None]:
    """Grow the log by `n` entries; the first index reserved and the stored leaf hash of the
    entry before it (None: the log was empty, or this statement's snapshot does not show it).
    The head row's update also serialises appenders until the caller's transaction ends."""
    row = conn.execute(_RESERVE, {"n": n}).first()
    if row is None:
        raise RuntimeError("the audit log has no head row; the store did not initialise it")
    return int(row[0]) - n, node_of(row[1], 0)


def insert_rows(conn: Connection, events: list[dict[str, Any]]) -> None:
    """Insert the records (`events`: EventRow columns, `merkle` included): one statement."""
    conn.execute(_INSERT_EVENTS, events)


def fetch_nodes(conn: Connection, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
    """Stored node hashes by (level, idx), read from the entries that keep them: one indexed
    SELECT per `_CHUNK` entries (a proof or a frontier needs O(log n), so one)."""
    wanted: dict[int, list[int]] = {}
    for level, idx in keys:
        wanted.setdefault(keeper(level, idx), []).append(level)
    rows = sorted(wanted)
    found: dict[tuple[int, int], bytes] = {}
    for chunk in range(0, len(rows), _CHUNK):
        for index, merkle in conn.execute(_MERKLE, {"rows": rows[chunk : chunk + _CHUNK]}):
            for level in wanted[int(index)]:
                node = node_of(merkle, level)
                if node is not None:
                    found[(level, ((int(index) + 1) >> level) - 1)] = node
    return found


def size(session: Session) -> int:
    """The number of entries in the log (as this transaction sees it)."""
    value = session.scalar(select(AuditHeadRow.size).where(AuditHeadRow.id == HEAD_ID))
    return int(value or 0)


def logged(session: Session, kind: str, subject: str) -> bool:
    """Whether a record of `kind` about `subject` (e.g. a rule set's hash) is in the log."""
    query = select(EventRow.id).where(EventRow.kind == kind, EventRow.subject == subject).limit(1)
    return session.scalar(query) is not None


def entries(session: Session, start: int, end: int) -> list[tuple[int, bytes]]:
    """(index, record) for entries start..end-1 as stored (a missing row is simply absent)."""
    rows = session.execute(
        select(EventRow.log_index, EventRow.record)
        .where(EventRow.log_index >= start, EventRow.log_index < end)
        .order_by(EventRow.log_index)
    )
    return [(int(i), bytes(r)) for i, r in rows]


def leaf_hashes(session: Session, start: int, end: int) -> dict[int, bytes]:
    """The stored leaf hashes of entries start..end-1, by index (an entry without a whole
    one is left out, like a missing entry)."""
    rows = session.execute(
        select(EventRow.log_index, EventRow.merkle).where(
            EventRow.log_index >= start, EventRow.log_index < end
        )
    )
    found = {int(i): node_of(m, 0) for i, m in rows}
    return {i: h for i, h in found.items() if h is not None}


def events(session: Session, sequence_id: str | None = None) -> list[EventRow]:
    """The log's rows in order (those of one sequence with `sequence_id`)."""
    query = select(EventRow).order_by(EventRow.log_index)
    if sequence_id is not None:
        query = query.where(EventRow.sequence_id == sequence_id)
    return list(session.scalars(query))


def last_event(session: Session, kind: str) -> EventRow | None:
    """The newest row of `kind`, if any."""
    query = select(EventRow).where(EventRow.kind == kind)
    return session.scalars(query.order_by(EventRow.log_index.desc()).limit(1)).first()
