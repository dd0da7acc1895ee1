"""The store's database: its engine, transactions and the caches every store module shares.

`Database` is what the store's modules take (`store: Database`): the engine, `transaction()`
and `one_statement()`, and the few things kept in memory across requests. `Store` (the
package's facade) is a `Database` with the public method names as delegates; the modules below
it never import the package itself, so the store's modules depend one way.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from safeaccess.server.store import frontier, log, migrate
from safeaccess.server.store.schema import DatasetRow, SequenceRow, StepRow


def make_engine(url: str) -> Engine:
    """The SQLAlchemy engine of a store URL (SQLite gets WAL, foreign keys and full sync)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            # WAL lets readers proceed while one writer commits; foreign keys are off by default.
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


class RunningSteps:
    """The sequence and step rows as this process last wrote them when it started a step
    running, until it settles the step (`settle_step` then needs no read: the sequence's
    version in its guarded UPDATE proves nothing changed since). Bounded: a step settled
    elsewhere (another replica, after a restart) leaves its entry until it is pushed out."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._rows: OrderedDict[tuple[str, int], tuple[SequenceRow, StepRow]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, seq: SequenceRow, step: StepRow) -> None:
        """Keep the rows of a step just recorded `running` (and its sequence's)."""
        with self._lock:
            self._rows[(seq.id, step.index)] = (seq, step)
            while len(self._rows) > self.LIMIT:
                self._rows.popitem(last=False)

    def take(self, sequence_id: str, index: int) -> tuple[SequenceRow, StepRow] | None:
        """The rows kept for step `index` of a sequence, forgotten from now on (None: none)."""
        with self._lock:
            return self._rows.pop((sequence_id, index), None)


class Database:
    """Transactions over the safeaccess schema: the engine, `transaction()`, `one_statement()`
    and the caches shared by every store module."""

    def __init__(self, url: str):
        self.engine = make_engine(url)
        try:
            migrate.ensure(self.engine)
        except migrate.SchemaBehind:
            self.engine.dispose()
            raise
        # Every session shares the audit log's frontier, published only once its transaction
        # committed (`store/frontier.py`): an append then reads no stored nodes.
        self._sessions = sessionmaker(
            self.engine, expire_on_commit=False, info={frontier.SHARED: frontier.Frontier()}
        )
        event.listen(self._sessions, "after_commit", frontier.publish_pending)
        event.listen(self._sessions, "after_soft_rollback", frontier.drop_pending)
        # For statements that stand alone (`one_statement`). On PostgreSQL, the same pool with
        # its connections in autocommit while lent out (reset on return): no BEGIN and COMMIT,
        # two round trips of four. SQLite's driver begins a transaction only before a write, so
        # a read pays nothing for one; switching a connection to autocommit and back would
        # cost more (about 45 µs a use, measured).
        self._standalone = (
            self.engine
            if self.engine.dialect.name == "sqlite"
            else self.engine.execution_options(isolation_level="AUTOCOMMIT")
        )
        with self.transaction() as s:
            log.ensure_head(s)
        #: Rule-set hashes known to be in the log (only committed facts: the log only grows).
        self.logged_rulesets: set[str] = set()
        #: A registered dataset version never changes (a new version is a new row), so rows
        #: read once are kept: every step needs its dataset several times.
        self.dataset_cache: dict[int, DatasetRow] = {}
        #: When this process last deleted expired request nonces (`catalogue.remember_nonce`).
        self.nonces_purged_at = 0
        #: The rows of steps this process started `running`, until it settles them.
        self.running = RunningSteps()

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One transaction: commits on success, rolls back on any exception."""
        with self._sessions.begin() as session:
            yield session

    @contextmanager
    def one_statement(self) -> Iterator[Connection]:
        """A Core connection for statements that each stand alone: the small reads on a step's
        path and a request's nonce. One statement sees one snapshot anyway, so it needs no
        transaction around it: on PostgreSQL it runs in autocommit (see `_standalone`); on
        SQLite a write commits when the block ends. An ORM session and its commit cost about
        six times such a read."""
        with self._standalone.begin() as conn:
            yield conn
