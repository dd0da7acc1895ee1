"""The audit log's frontier kept in memory (`store/frontier.py`): an append reads no stored
nodes when this process committed the log's last append, and the tree stays exact when another
replica appends in between or an append rolls back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from safeaccess.client.audit.merkle import leaf_hash, root_of, verify_consistency, verify_inclusion
from safeaccess.server.store import Store, auditlog


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'log.sqlite'}"
    return str(request.getfixturevalue("postgres_database"))


@pytest.fixture
def replicas(url: str) -> Iterator[tuple[Store, Store]]:
    """Two stores over one database: two replicas of the server."""
    first = Store(url)
    second = Store(url)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def _append(store: Store, n: int, tag: str) -> list[int]:
    with store.transaction() as s:
        return auditlog.append_many(
            s, [auditlog.Entry("test", "tester", {"tag": tag, "i": i}) for i in range(n)]
        )


def _node_reads(store: Store) -> tuple[list[str], Any]:
    reads: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "merkle" in statement:
            reads.append(statement)

    event.listen(store.engine, "before_cursor_execute", count)
    return reads, count


def _check_tree(store: Store) -> None:
    """Every root and proof of the stored tree matches the tree rebuilt from its records."""
    with store.transaction() as s:
        size = auditlog.size(s)
        # The leaves from the records themselves, not from the stored nodes.
        leaves = [leaf_hash(e.record) for e in sorted(store.events(), key=lambda e: e.log_index)]
        assert len(leaves) == size
        for n in range(1, size + 1):
            root = auditlog.root(s, n)
            assert root == root_of(leaves[:n]), n
            for index in range(n):
                verify_inclusion(
                    index, n, leaves[index], auditlog.inclusion_proof(s, index, n), root
                )
            for m in range(1, n + 1):
                verify_consistency(
                    m, n, root_of(leaves[:m]), root, auditlog.consistency_proof(s, m, n)
                )


def test_an_append_after_this_process_appended_reads_no_nodes(
    replicas: tuple[Store, Store],
) -> None:
    store, _ = replicas
    _append(store, 3, "warm")  # 3 entries: leaf 3 will complete stored subtrees
    reads, count = _node_reads(store)
    try:
        for n in (1, 2, 3, 1, 4, 5):
            _append(store, n, "hot")
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
    assert reads == []
    _check_tree(store)


def test_appends_of_two_replicas_interleaved_make_the_same_tree(
    replicas: tuple[Store, Store],
) -> None:
    first, second = replicas
    reads, count = _node_reads(first)
    try:
        for n, store in enumerate([first, second, first, first, second, second, first] * 2):
            _append(store, 1 + n % 4, f"r{n}")
    finally:
        event.remove(first.engine, "before_cursor_execute", count)
    # After the other replica appended, the frontier is read from the database again.
    assert reads
    _check_tree(first)


def test_a_rolled_back_append_leaves_no_frontier_behind(replicas: tuple[Store, Store]) -> None:
    first, second = replicas
    _append(first, 6, "base")
    with pytest.raises(RuntimeError, match="abandoned"), first.transaction() as s:
        auditlog.append_many(s, [auditlog.Entry("test", "tester", {"gone": 0})])
        raise RuntimeError("abandoned")
    # The other replica commits another record at the index the rolled-back append had taken:
    # a frontier kept from that append would now match the log's size, and leaf 7 completes
    # subtrees that include leaf 6.
    _append(second, 1, "other")
    _append(first, 1, "after")
    _check_tree(first)


def test_a_savepoint_rolled_back_drops_the_pending_frontier(replicas: tuple[Store, Store]) -> None:
    first, second = replicas
    _append(first, 2, "base")
    with first.transaction() as s:
        nested = s.begin_nested()
        auditlog.append_many(s, [auditlog.Entry("test", "tester", {"gone": 0})])
        nested.rollback()
    # As above, with the outer transaction committed after its savepoint rolled back.
    _append(second, 1, "other")
    _append(first, 1, "after")
    _check_tree(first)


def test_a_log_rewritten_under_the_server_is_not_extended_from_the_kept_frontier(
    replicas: tuple[Store, Store],
) -> None:
    first, second = replicas
    _append(first, 6, "original")  # `first` keeps the frontier of the log of 6 entries
    # The log rewritten to 3 entries (a backup restored, or an insider), then grown back to 6
    # by another replica with other records: same size, other leaves.
    with first.engine.begin() as conn:
        # (the nodes of the rewritten leaves go with their entries' rows)
        conn.execute(text("DELETE FROM events WHERE log_index >= 3"))
        conn.execute(text("UPDATE audit_head SET size = 3"))
    _append(second, 3, "rewritten")
    _append(first, 2, "after")  # leaf 7 completes subtrees over the rewritten leaves
    _check_tree(first)
