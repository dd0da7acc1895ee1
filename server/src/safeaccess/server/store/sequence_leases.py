"""Which API replica is working on a sequence, seen by every other replica (execution = "local"
on PostgreSQL).

A replica that runs steps itself holds, from before a step is recorded `running` until it is
settled, a session-level PostgreSQL advisory lock keyed by the sequence, on one connection of its
own (not the pool's: a step held for seconds must not keep a pooled connection, and one
connection serves every lease of the process). PostgreSQL frees a session's locks when the
session ends, so when a replica dies its leases go with its connection: a step still `running`
whose sequence's lease another replica can take has nobody computing it (`steps/orphans.py` then runs
it again). Nothing has to expire on a clock and no row is written.

The leases are taken with `pg_try_advisory_lock`, polled: a blocking `pg_advisory_lock` would
hold the one connection that every other lease of the process needs.

If the lease connection itself is lost (PostgreSQL restarting), the process's leases are gone
while its steps may still run; another replica may then run one of them again. That is safe:
a step is recorded once (the settle is guarded by the sequence's version) and the auditor's
scope pointer moves only with that record. The connection is made again at the next use.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import psycopg

from safeaccess.server.errors import Unavailable
from safeaccess.server.store.advisory_locks import advisory_key
from safeaccess.server.store.settled import conninfo

log = logging.getLogger("safeaccess.server")

#: The advisory-lock kind of sequence leases (`advisory_key`).
KIND = "sequence-lease"
#: Seconds between two tries of a lease another replica holds.
POLL_SECONDS = 0.05


class SequenceLeases:
    """This process's leases on the sequences it works on (PostgreSQL)."""

    def __init__(self, url: str, wait_seconds: float):
        self._conninfo = conninfo(url)
        self.wait_seconds = wait_seconds
        self._connection: psycopg.Connection | None = None
        self._guard = threading.Lock()

    def _execute(self, sql: str, key: int) -> bool:
        with self._guard:
            for attempt in (1, 2):
                try:
                    if self._connection is None or self._connection.closed:
                        self._connection = psycopg.connect(self._conninfo, autocommit=True)
                    row = self._connection.execute(sql, (key,)).fetchone()
                    return bool(row and row[0])
                except psycopg.OperationalError as exc:
                    # The session is gone, and every lease it held with it.
                    if self._connection is not None:
                        with contextlib.suppress(Exception):
                            self._connection.close()
                    self._connection = None
                    if attempt == 2:
                        raise Unavailable(
                            "the centre's database is unavailable for a moment; retry"
                        ) from exc
                    log.warning("the sequence-lease connection was lost; connecting again")
        raise AssertionError("unreachable")

    def _take(self, key: int) -> bool:
        return self._execute("SELECT pg_try_advisory_lock(%s)", key)

    def _give_back(self, key: int) -> None:
        with contextlib.suppress(Unavailable):  # the session ended, and its locks with it
            self._execute("SELECT pg_advisory_unlock(%s)", key)

    def try_take(self, sequence_id: str) -> bool:
        """Take the sequence's lease if no replica holds it; True if taken."""
        return self._take(advisory_key(KIND, sequence_id))

    def give_back(self, sequence_id: str) -> None:
        """Release a lease this process took."""
        self._give_back(advisory_key(KIND, sequence_id))

    @contextlib.contextmanager
    def hold(self, sequence_id: str) -> Iterator[None]:
        """Hold the sequence's lease, waiting while another replica holds it (at most
        `wait_seconds`, then "retry later")."""
        key = advisory_key(KIND, sequence_id)  # the lock's key, for taking and giving it back
        deadline = time.monotonic() + self.wait_seconds
        while not self._take(key):
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"sequence {sequence_id} is being worked on by another server; retry later"
                )
            time.sleep(POLL_SECONDS)
        try:
            yield
        finally:
            self._give_back(key)

    def close(self) -> None:
        with self._guard:
            if self._connection is not None:
                with contextlib.suppress(Exception):
                    self._connection.close()
                self._connection = None
