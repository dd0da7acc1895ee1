"""The audit log's right edge as this process last committed it, so an append reads no nodes.

An append at index `first` needs the stored left siblings its new leaves complete, and every one
of them is a perfect subtree of the cover of [0, first) (the binary decomposition of `first`):
the "frontier" of the tree of size `first`. A committed log prefix never changes (the log only
grows), so the frontier of size `first` is a fact about the database once some transaction that
grew the log to `first` committed; keyed by that size it can be kept across transactions.

What keeps it exact:
- it is published only after the transaction that computed it committed (`publish_pending`, a
  listener on the store's sessions), never from a transaction that rolled back (any rollback,
  a savepoint's included, drops what is pending);
- it is used only when the head row's reserve returns exactly its size and, read by the same
  statement, the stored leaf of the entry before the reserved ones is the frontier's last leaf.
  Another replica (or another process) that appended meanwhile moves the head past it; a
  database restored under a running server (a backup, or the audit tests' tampering) has other
  records at that size, so other leaves. The append then reads the nodes it needs from the
  database as before.

Kept in the session's `info` (the store's sessionmaker hands every session the same `Frontier`),
so the audit log needs no reference to the store.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from safeaccess.client.audit.merkle import cover

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

#: The `Session.info` key of the shared `Frontier` (set by the store's sessionmaker).
SHARED = "safeaccess.audit.frontier"
#: The `Session.info` key of the frontier an uncommitted append computed: (size, nodes).
_PENDING = "safeaccess.audit.frontier.pending"

Nodes = dict[tuple[int, int], bytes]


def keys(size: int) -> list[tuple[int, int]]:
    """The (level, index) of the perfect subtrees whose hashes make the tree of `size` leaves."""
    return cover(0, size) if size > 0 else []


def _ends_with(nodes: Nodes, size: int, last_leaf: bytes | None) -> bool:
    """Whether the frontier `nodes` of a log of `size` entries ends with the leaf `last_leaf`."""
    return last_leaf is not None and nodes.get((0, size - 1)) == last_leaf


class Frontier:
    """The frontier of the last log this process committed: its size, its nodes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._size = 0
        self._nodes: Nodes = {}

    def at(self, size: int, last_leaf: bytes | None) -> Nodes | None:
        """The frontier's nodes if it is that of a log of exactly `size` entries whose last
        leaf is `last_leaf`, else None."""
        with self._lock:
            if size != self._size or not _ends_with(self._nodes, size, last_leaf):
                return None
            return dict(self._nodes)

    def publish(self, size: int, nodes: Nodes) -> None:
        """Keep the frontier of a committed log of `size` entries (`nodes`: those of
        `keys(size)` and the last leaf, (0, size - 1))."""
        with self._lock:
            self._size, self._nodes = size, dict(nodes)


def known(session: Session, size: int, last_leaf: bytes | None) -> Nodes | None:
    """The frontier of a log of `size` entries ending with the stored leaf `last_leaf`, as this
    transaction's own earlier append or the last committed one left it, or None (the caller
    reads the nodes)."""
    pending = session.info.get(_PENDING)
    if pending is not None and pending[0] == size and _ends_with(pending[1], size, last_leaf):
        return dict(pending[1])
    shared = session.info.get(SHARED)
    return shared.at(size, last_leaf) if isinstance(shared, Frontier) else None


def remember(session: Session, size: int, nodes: Nodes) -> None:
    """Hold the frontier of the log this transaction grew to `size`, until it commits."""
    if isinstance(session.info.get(SHARED), Frontier):
        session.info[_PENDING] = (size, nodes)


def publish_pending(session: Session) -> None:
    """After a commit: the frontier the transaction computed becomes the shared one."""
    pending = session.info.pop(_PENDING, None)
    shared = session.info.get(SHARED)
    if pending is not None and isinstance(shared, Frontier):
        shared.publish(*pending)


def drop_pending(session: Session, *_args: Any) -> None:
    """After any rollback (a savepoint's too): what was computed may not be committed."""
    session.info.pop(_PENDING, None)
