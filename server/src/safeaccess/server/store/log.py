"""The audit log's rows: the head (its size), the records and the stored Merkle nodes.

Only SQL lives here; what the rows mean (record encoding, which nodes a new leaf completes,
roots and proofs) is `safeaccess.server.audit.log`. Every function runs in the caller's
transaction, so a record exists exactly when the change it records committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import (
    Connection,
    Executable,
    Table,
    bindparam,
    insert,
    select,
    union_all,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from safeaccess.server.store.schema import AuditHeadRow, AuditNodeRow, EventRow

HEAD_ID = 1
_HEAD: Table = AuditHeadRow.__table__  # type: ignore[assignment]
_NODES: Table = AuditNodeRow.__table__  # type: ignore[assignment]
_EVENTS: Table = EventRow.__table__  # type: ignore[assignment]
# Built once: statement construction costs more than executing them on the append path.
# The reserve also returns the leaf hash of the entry before the reserved ones (NULL when there
# is none, or when the database's snapshot of this statement does not show it yet): what an
# appender's kept frontier is checked against (`audit/frontier.py`).
_PREVIOUS_LEAF = (
    select(_NODES.c.hash)
    .where(_NODES.c.level == 0, _NODES.c.idx == _HEAD.c.size - bindparam("n") - 1)
    .scalar_subquery()
)
_RESERVE = (
    update(_HEAD)
    .where(_HEAD.c.id == HEAD_ID)
    .values(size=_HEAD.c.size + bindparam("n"))
    .returning(_HEAD.c.size, _PREVIOUS_LEAF)
)
_INSERT_EVENTS = insert(_EVENTS)
_INSERT_NODES = insert(_NODES)
#: Node keys per query: well under every database's bound-parameter limit.
_CHUNK = 500


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
    return int(row[0]) - n, None if row[1] is None else bytes(row[1])


def insert_rows(
    conn: Connection, events: list[dict[str, Any]], nodes: dict[tuple[int, int], bytes]
) -> None:
    """Insert the records (`events`: EventRow columns) and the new nodes by (level, idx)."""
    conn.execute(_INSERT_EVENTS, events)
    conn.execute(
        _INSERT_NODES, [{"level": lv, "idx": i, "hash": h} for (lv, i), h in nodes.items()]
    )


def fetch_nodes(conn: Connection, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
    """Stored node hashes by (level, idx): one statement, an indexed SELECT per level (and per
    chunk) joined by UNION ALL."""
    by_level: dict[int, list[int]] = {}
    for level, idx in keys:
        by_level.setdefault(level, []).append(idx)
    parts = [
        (level, idxs[chunk : chunk + _CHUNK])
        for level, idxs in by_level.items()
        for chunk in range(0, len(idxs), _CHUNK)
    ]
    found: dict[tuple[int, int], bytes] = {}
    for batch in _batches(parts):
        params: dict[str, object] = {}
        for n, (level, idxs) in enumerate(batch):
            params[f"level{n}"], params[f"idxs{n}"] = level, idxs
        for level, idx, digest in conn.execute(_select_levels(len(batch)), params):
            found[(int(level), int(idx))] = bytes(digest)
    return found


def _batches(parts: list[tuple[int, list[int]]]) -> Iterator[list[tuple[int, list[int]]]]:
    """The parts in groups of at most `_PARTS` parts and `_CHUNK` indexes in all: one statement
    each, its bound parameters well under every database's limit."""
    batch: list[tuple[int, list[int]]] = []
    size = 0
    for part in parts:
        if batch and (len(batch) == _PARTS or size + len(part[1]) > _CHUNK):
            yield batch
            batch, size = [], 0
        batch.append(part)
        size += len(part[1])
    if batch:
        yield batch


#: Parts (level, chunk of indexes) per statement of `fetch_nodes`.
_PARTS = 8
_SELECT_LEVELS: dict[int, Executable] = {}


def _select_levels(n: int) -> Executable:
    """The UNION ALL of `n` one-level SELECTs (built once per `n`)."""
    statement = _SELECT_LEVELS.get(n)
    if statement is None:
        selects = [
            select(_NODES.c.level, _NODES.c.idx, _NODES.c.hash).where(
                _NODES.c.level == bindparam(f"level{i}"),
                _NODES.c.idx.in_(bindparam(f"idxs{i}", expanding=True)),
            )
            for i in range(n)
        ]
        built: Executable = selects[0] if n == 1 else union_all(*selects)
        statement = _SELECT_LEVELS[n] = built
    return statement


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
    """The stored leaf hashes of entries start..end-1, by index."""
    rows = session.execute(
        select(AuditNodeRow.idx, AuditNodeRow.hash).where(
            AuditNodeRow.level == 0, AuditNodeRow.idx >= start, AuditNodeRow.idx < end
        )
    )
    return {int(i): bytes(h) for i, h in rows}


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
