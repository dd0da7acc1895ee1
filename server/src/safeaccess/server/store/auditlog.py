"""The append-only audit log: canonical records, an RFC 9162 Merkle tree over them, proofs.

`append` runs inside the caller's transaction (the store's one transaction per state change), so
a record exists exactly when the change it records committed; a server killed mid-append leaves
neither. Appends are serialised by incrementing the single `audit_head` row first. Each entry's
row holds its record, its leaf hash and the perfect subtrees it completes (one more node on
average: `EventRow.merkle`), so roots and proofs are assembled from O(log n) stored nodes
without rehashing, and an append writes one row per entry.

Proof generation follows RFC 9162 §2.1.3.1 (PATH) and §2.1.4.1 (SUBPROOF) over subtree hashes;
verification is `safeaccess.client.audit.merkle`, the code auditors run. The rows themselves
(head, records, nodes) are read and written by `safeaccess.server.store.log`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from safeaccess.client.audit.merkle import (
    EMPTY_ROOT,
    consistency_ranges,
    cover,
    inclusion_ranges,
    leaf_hash,
    node_hash,
)
from safeaccess.client.audit.records import LOG_FORMAT, LOG_VERSION, encode_record
from safeaccess.server.errors import InvalidRequest, LogDamaged
from safeaccess.server.store import frontier
from safeaccess.server.store import log as log_rows
from safeaccess.server.store.log import completed, ensure_head, entries, leaf_hashes, logged, size

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def _timestamp(moment: datetime) -> str:
    # SQLite hands stored UTC times back without their zone.
    moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Entry:
    """One record to append: its kind, actor, data and what it is about."""

    kind: str
    actor: str
    data: dict[str, Any]
    sequence_id: str | None = None
    step_index: int | None = None
    subject: str | None = None
    #: The record's `time` when it is not the moment of appending: a step's outcome carries the
    #: time of the action it answers (see `store.sequences`), not when the run ended.
    time: datetime | None = None


def append(
    session: Session,
    kind: str,
    actor: str,
    data: dict[str, Any],
    *,
    sequence_id: str | None = None,
    step_index: int | None = None,
    subject: str | None = None,
) -> int:
    """Append one record in the caller's transaction; its index."""
    return append_many(session, [Entry(kind, actor, data, sequence_id, step_index, subject)])[0]


def append_many(session: Session, items: list[Entry]) -> list[int]:
    """Append records in order, in the caller's transaction; their indexes.

    Two statements whatever the number of records: reserve the indexes (the head row's update
    also serialises appenders), insert the records, each with the Merkle nodes it completes; a
    third reads the stored left siblings the new leaves complete only when this process does
    not hold the log's frontier at that size (`frontier.py`: its first append, or another
    replica appended since)."""
    if not items:
        return []
    # Core statements on the transaction's connection: the ORM's bookkeeping would cost more
    # than the SQL itself on this per-step path.
    conn = session.connection()
    first, previous = log_rows.reserve(conn, len(items))
    now = datetime.now(UTC)
    stamp = _timestamp(now)
    records = [
        encode_record(
            {
                "log": LOG_FORMAT,
                "version": LOG_VERSION,
                "index": first + n,
                "time": stamp if item.time is None else _timestamp(item.time),
                "kind": item.kind,
                "actor": item.actor,
                "sequence": item.sequence_id,
                "step": item.step_index,
                "data": item.data,
            }
        )
        for n, item in enumerate(items)
    ]
    nodes = _new_nodes(session, first, previous, [leaf_hash(r) for r in records])
    log_rows.insert_rows(
        conn,
        [
            {
                "log_index": first + n,
                "at": now,
                "kind": item.kind,
                "actor": item.actor,
                "sequence_id": item.sequence_id,
                "step_index": item.step_index,
                "subject": item.subject,
                "record": record,
                "merkle": _kept_by(first + n, nodes),
            }
            for n, (item, record) in enumerate(zip(items, records, strict=True))
        ],
    )
    return [first + n for n in range(len(items))]


def _kept_by(index: int, nodes: dict[tuple[int, int], bytes]) -> bytes:
    """The `merkle` of entry `index`: its leaf, then each subtree it completes, from `nodes`."""
    return b"".join(nodes[(level, index >> level)] for level in range(completed(index) + 1))


def _new_nodes(
    session: Session, first: int, previous: bytes | None, leaves: list[bytes]
) -> dict[tuple[int, int], bytes]:
    """The leaf and the perfect subtrees completed by appending `leaves` at index `first`.

    The stored left siblings they need are all in the frontier of the log of `first` entries
    (`frontier.py`): taken from the one this process last committed (or this transaction's
    earlier append) when it is of that size and ends with the leaf `previous` the reserve read
    (the stored leaf of entry `first - 1`), else read (with the rest of that frontier, in the
    same statement, so the next append need not read)."""
    needed: list[tuple[int, int]] = []
    for n in range(len(leaves)):
        level, idx = 0, first + n
        while idx & 1:
            if (idx << level) <= first:  # the left sibling ends before this batch: stored
                needed.append((level, idx - 1))
            level, idx = level + 1, idx >> 1
    known = frontier.known(session, first, previous)
    if known is None and needed:
        known = log_rows.fetch_nodes(session.connection(), frontier.keys(first))
    new: dict[tuple[int, int], bytes] = {}
    for n, leaf in enumerate(leaves):
        level, idx, current = 0, first + n, leaf
        new[(0, idx)] = current
        while idx & 1:
            left = new.get((level, idx - 1)) or (known or {}).get((level, idx - 1))
            if left is None:
                raise RuntimeError(f"audit node ({level}, {idx - 1}) is missing")
            current = node_hash(left, current)
            level, idx = level + 1, idx >> 1
            new[(level, idx)] = current
    # Every subtree of the new frontier is new or was in the old one (see `frontier.py`); kept
    # when all are at hand (the old one was, or the new leaves cover it: an empty log's), with
    # the last leaf, which the next append's reserve reads back.
    end = first + len(leaves)
    edge = {key: new.get(key) or (known or {}).get(key) for key in frontier.keys(end)}
    if all(edge.values()):
        frontier.remember(session, end, {**edge, (0, end - 1): new[(0, end - 1)]})  # type: ignore[dict-item]
    return new


# -- subtree hashes -----------------------------------------------------------------------------


class _Nodes:
    """Fetches the perfect subtrees that a set of ranges needs, in one indexed query."""

    def __init__(self, session: Session, ranges: list[tuple[int, int]]):
        wanted = {key for start, end in ranges for key in cover(start, end)}
        self._session = session
        self._hashes = log_rows.fetch_nodes(session.connection(), wanted)

    def mth(self, start: int, end: int) -> bytes:
        parts = [self._get(key) for key in cover(start, end)]
        # cover lists left to right; RFC 9162 combines the right edge first.
        root = parts.pop()
        while parts:
            root = node_hash(parts.pop(), root)
        return root if start < end else EMPTY_ROOT

    def _get(self, key: tuple[int, int]) -> bytes:
        try:
            return self._hashes[key]
        except KeyError:
            # Name the first bad entry (as a verifier reading the entries would), not just the
            # one that keeps this node.
            keeper = log_rows.keeper(*key)
            first = log_rows.first_damaged(self._session.connection(), keeper + 1)
            entry, what = first or (keeper, "its row does not hold its Merkle hashes whole")
            raise LogDamaged(
                entry,
                f"{what}; the log's tree cannot be computed over it (Merkle node {key}, kept "
                f"by entry {keeper}, is not there whole)",
            ) from None


def _check_size(session: Session, tree_size: int) -> None:
    current = size(session)
    if not 0 <= tree_size <= current:
        raise InvalidRequest(f"the log has {current} entries; size {tree_size} is not available")


def root(session: Session, tree_size: int) -> bytes:
    _check_size(session, tree_size)
    if tree_size == 0:
        return EMPTY_ROOT
    return _Nodes(session, [(0, tree_size)]).mth(0, tree_size)


def inclusion_proof(session: Session, index: int, tree_size: int) -> list[bytes]:
    _check_size(session, tree_size)
    if not 0 <= index < tree_size:
        raise InvalidRequest(f"entry {index} is not in a log of {tree_size} entries")
    ranges = inclusion_ranges(index, tree_size)
    nodes = _Nodes(session, ranges)
    return [nodes.mth(a, b) for a, b in ranges]


def consistency_proof(session: Session, size1: int, size2: int) -> list[bytes]:
    _check_size(session, size2)
    if not 0 <= size1 <= size2:
        raise InvalidRequest(f"no consistency proof from size {size1} to size {size2}")
    if size1 in (0, size2):
        return []
    ranges = consistency_ranges(size1, size2)
    nodes = _Nodes(session, ranges)
    return [nodes.mth(a, b) for a, b in ranges]


__all__ = [
    "append",
    "consistency_proof",
    "ensure_head",
    "entries",
    "inclusion_proof",
    "leaf_hashes",
    "logged",
    "root",
    "size",
]
