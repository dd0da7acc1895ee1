"""The audit log's Merkle nodes move into the entries that complete them.

Each entry's row gains `merkle`: its leaf hash, then the hash of every perfect subtree it
completes (the node at level l over leaves [idx * 2^l, (idx + 1) * 2^l) belongs to the entry
(idx + 1) * 2^l - 1). An append then writes one row per entry instead of a record and a node
row or two, which was one more statement in every transaction that records anything (two per
step). The nodes already stored are copied into the entries that complete them, and the
`audit_nodes` table is dropped; the downgrade rebuilds it from the entries.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from safeaccess.server.store.migrations.tables import create_audit_nodes

revision = "0008"
down_revision = "0007"

HASH = 32
#: Entries copied per batch: bounds the migration's memory on a log of millions of entries.
BATCH = 2000

_events = sa.table(
    "events",
    sa.column("log_index", sa.BigInteger()),
    sa.column("merkle", sa.LargeBinary()),
)
_nodes = sa.table(
    "audit_nodes",
    sa.column("level", sa.Integer()),
    sa.column("idx", sa.BigInteger()),
    sa.column("hash", sa.LargeBinary()),
)


def _levels(index: int) -> int:
    """The levels the entry at `index` keeps: its leaf and one per trailing 1 bit."""
    return (index ^ (index + 1)).bit_length()


def _indexes(conn: sa.Connection) -> list[int]:
    query = sa.select(_events.c.log_index).order_by(_events.c.log_index)
    return [int(i) for (i,) in conn.execute(query)]


def upgrade() -> None:
    op.add_column("events", sa.Column("merkle", sa.LargeBinary(), nullable=True))
    conn = op.get_bind()
    indexes = _indexes(conn)
    for start in range(0, len(indexes), BATCH):
        batch = indexes[start : start + BATCH]
        wanted: dict[int, set[int]] = {}
        for i in batch:
            for level in range(_levels(i)):
                wanted.setdefault(level, set()).add(i >> level)
        stored: dict[tuple[int, int], bytes] = {}
        for level, idxs in wanted.items():
            query = sa.select(_nodes.c.idx, _nodes.c.hash).where(
                _nodes.c.level == level, _nodes.c.idx.in_(sorted(idxs))
            )
            for idx, digest in conn.execute(query):
                stored[(level, int(idx))] = bytes(digest)
        rows = []
        for i in batch:
            parts = []
            for level in range(_levels(i)):
                node = stored.get((level, i >> level))
                if node is None:
                    break  # a damaged store stays damaged: its proofs name the missing node
                parts.append(node)
            rows.append({"i": i, "m": b"".join(parts)})
        conn.execute(
            _events.update()
            .where(_events.c.log_index == sa.bindparam("i"))
            .values(merkle=sa.bindparam("m")),
            rows,
        )
    op.drop_table("audit_nodes")


def downgrade() -> None:
    create_audit_nodes()
    conn = op.get_bind()
    query = sa.select(_events.c.log_index, _events.c.merkle).order_by(_events.c.log_index)
    rows: list[dict[str, object]] = []
    for index, merkle in conn.execute(query).all():
        merkle = bytes(merkle or b"")
        for level in range(len(merkle) // HASH):
            node = merkle[level * HASH : (level + 1) * HASH]
            rows.append({"level": level, "idx": int(index) >> level, "hash": node})
        if len(rows) >= BATCH:
            conn.execute(_nodes.insert(), rows)
            rows = []
    if rows:
        conn.execute(_nodes.insert(), rows)
    with op.batch_alter_table("events") as batch:
        batch.drop_column("merkle")
