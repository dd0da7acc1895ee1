"""The query-set auditor's per-scope lock: on PostgreSQL an advisory lock every replica sees (a
second replica waits, other scopes never do, a timeout answers "retry later", a dead holder frees
it); on SQLite the in-process lock of before."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text

from safeaccess.server.errors import Unavailable
from safeaccess.server.qss_scope import ScopeAuditor
from safeaccess.server.store import Store
from safeaccess.server.store.scope_locks import advisory_key

SCOPE = "census/project/p1"
OTHER = "census/project/p2"


@pytest.fixture
def pg_store(postgres_database: str) -> Iterator[Store]:
    store = Store(postgres_database)
    yield store
    store.close()


def _waiting(store: Store, key: int) -> int:
    """How many sessions wait for the advisory lock `key` (pg_locks splits it in two halves)."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    with store.engine.connect() as connection:
        return int(
            connection.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    "AND classid::bigint = :hi AND objid::bigint = :lo"
                ),
                {"hi": unsigned >> 32, "lo": unsigned & 0xFFFF_FFFF},
            ).scalar_one()
        )


def test_keys_are_stable_across_processes_and_differ_between_scopes() -> None:
    # Python's own hash is salted per process; the key must not be.
    code = "from safeaccess.server.store.scope_locks import advisory_key as k; print(k(%r))"
    seen = {
        subprocess.run(
            [sys.executable, "-c", code % SCOPE],
            env={"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert seen == {str(advisory_key(SCOPE))}
    keys = {advisory_key(f"census/researcher/r{i}") for i in range(1000)}
    assert len(keys) == 1000
    assert all(-(2**63) <= k < 2**63 for k in keys)


def test_a_second_replica_waits_for_the_scope_and_then_holds_it(
    pg_store: Store, postgres_database: str, tmp_path: Path
) -> None:
    other_store = Store(postgres_database)  # a second replica: its own engine and process locks
    try:
        first = ScopeAuditor(tmp_path, pg_store)
        second = ScopeAuditor(tmp_path, other_store)
        assert first.shared_locks and second.shared_locks
        held = first.lock(SCOPE)
        held.acquire()
        acquired = threading.Event()
        waiter = second.lock(SCOPE)

        def wait_for_it() -> None:
            waiter.acquire()
            acquired.set()

        thread = threading.Thread(target=wait_for_it)
        thread.start()
        deadline = time.monotonic() + 10
        while _waiting(pg_store, advisory_key(SCOPE)) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _waiting(pg_store, advisory_key(SCOPE)) == 1  # waiting in the database
        assert not acquired.is_set()
        # another scope is not blocked, on either replica
        free = second.lock(OTHER)
        started = time.monotonic()
        free.acquire()
        assert time.monotonic() - started < 2
        free.release()
        held.release()
        thread.join(timeout=10)
        assert acquired.is_set()
        waiter.release()
    finally:
        other_store.close()


def test_a_held_scope_times_out_as_retry_later(pg_store: Store, tmp_path: Path) -> None:
    auditor = ScopeAuditor(tmp_path, pg_store, lock_timeout_seconds=0.5)
    holder = pg_store.engine.connect()
    holder.execute(select(func.pg_advisory_lock(advisory_key(SCOPE))))
    try:
        started = time.monotonic()
        with pytest.raises(Unavailable, match="retry the same reveal") as refused:
            auditor.lock(SCOPE).acquire()
        assert refused.value.code == "audit_unavailable"
        assert 0.4 < time.monotonic() - started < 5
        # the refusal gave the process's lock back: another step of the scope can try again
        assert auditor._locks[SCOPE].acquire(blocking=False)
        auditor._locks[SCOPE].release()
    finally:
        holder.execute(select(func.pg_advisory_unlock(advisory_key(SCOPE))))
        holder.close()
    lock = auditor.lock(SCOPE)
    lock.acquire()  # free again
    lock.release()


def test_a_dead_holder_frees_the_scope(postgres_database: str, tmp_path: Path) -> None:
    crashed = Store(postgres_database)
    survivor = Store(postgres_database)
    try:
        held = ScopeAuditor(tmp_path, crashed).lock(SCOPE)
        held.acquire()
        # the holder's connection dies (a replica killed mid-admission): the server ends its
        # transaction, and with it the lock
        assert held.shared is not None and held.shared._connection is not None
        backend = held.shared._connection.execute(select(func.pg_backend_pid())).scalar_one()
        admin = create_engine(postgres_database)
        with admin.connect() as connection:
            assert connection.execute(select(func.pg_terminate_backend(backend))).scalar_one()
        admin.dispose()
        lock = ScopeAuditor(tmp_path, survivor, lock_timeout_seconds=5).lock(SCOPE)
        lock.acquire()
        lock.release()
        held.release()  # the dead holder's release does not fail (nothing is left to free)
    finally:
        crashed.close()
        survivor.close()


def test_sqlite_keeps_the_process_lock(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        auditor = ScopeAuditor(tmp_path, store)
        assert not auditor.shared_locks
        lock = auditor.lock(SCOPE)
        assert lock.shared is None
        lock.acquire()
        assert not auditor._locks[SCOPE].acquire(blocking=False)  # held in this process
        other = auditor.lock(OTHER)
        other.acquire()
        other.release()
        lock.release()
        assert auditor._locks[SCOPE].acquire(blocking=False)
    finally:
        store.close()
