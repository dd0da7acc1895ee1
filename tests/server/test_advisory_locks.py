"""Locks shared by replicas (`store.advisory_locks`). The query-set auditor's per-scope lock: on
PostgreSQL an advisory lock every replica sees (a second replica waits, other scopes never do, a
timeout answers "retry later", a dead holder frees it); on SQLite the in-process lock of before.
The withhold budget's and the DP ledger's locks, with two services (replicas) on one database
opening at the same moment, against a control with the in-process locks alone."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import create_engine, func, select, text

from safeaccess.client.analyses import Analysis, DPCount, FrequencyTable, to_body
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.protocol import seal
from safeaccess.client.results import StepResult
from safeaccess.client.session import ServerError, connect
from safeaccess.server.admin.cli import main as server_cli
from safeaccess.server.config import DataDir, initialise
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.errors import Unavailable
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.qss.scope import LOCK_KIND, ScopeAuditor
from safeaccess.server.service import Service
from safeaccess.server.steps import flow as flow_module
from safeaccess.server.steps.flow import Flow
from safeaccess.server.store import Store
from safeaccess.server.store.advisory_locks import advisory_key

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
    code = "from safeaccess.server.store.advisory_locks import advisory_key as k; print(k(%r, %r))"
    # Both processes at once: each spends its time importing the server's store.
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code % (LOCK_KIND, SCOPE)],
            env={"PYTHONHASHSEED": seed},
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in ("1", "2")
    ]
    outputs = [p.communicate(timeout=120)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0]
    seen = {out.strip() for out in outputs}
    assert seen == {str(advisory_key(LOCK_KIND, SCOPE))}
    keys = {advisory_key(LOCK_KIND, f"census/researcher/r{i}") for i in range(1000)}
    assert len(keys) == 1000
    # the same name under another kind of lock is another lock
    assert advisory_key("dp-ledger", SCOPE) != advisory_key(LOCK_KIND, SCOPE)
    assert all(-(2**63) <= k < 2**63 for k in keys)


def test_a_second_replica_waits_for_the_scope_and_then_holds_it(
    pg_store: Store, postgres_database: str, tmp_path: Path
) -> None:
    other_store = Store(postgres_database)  # a second replica: its own engine and process locks
    try:
        first = ScopeAuditor(tmp_path, pg_store)
        second = ScopeAuditor(tmp_path, other_store)
        assert first.locks.across_replicas and second.locks.across_replicas
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
        while (
            _waiting(pg_store, advisory_key(LOCK_KIND, SCOPE)) == 0 and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert _waiting(pg_store, advisory_key(LOCK_KIND, SCOPE)) == 1  # waiting in the database
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
    holder.execute(select(func.pg_advisory_lock(advisory_key(LOCK_KIND, SCOPE))))
    try:
        started = time.monotonic()
        with pytest.raises(Unavailable, match="retry the same reveal") as refused:
            auditor.lock(SCOPE).acquire()
        assert refused.value.code == "audit_unavailable"
        assert 0.4 < time.monotonic() - started < 5
        # the refusal gave the process's lock back: another step of the scope can try again
        assert auditor.locks.local(SCOPE).acquire(blocking=False)
        auditor.locks.local(SCOPE).release()
    finally:
        holder.execute(select(func.pg_advisory_unlock(advisory_key(LOCK_KIND, SCOPE))))
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
        shared = held.lock.shared
        assert shared is not None and shared._connection is not None
        backend = shared._connection.execute(select(func.pg_backend_pid())).scalar_one()
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
        assert not auditor.locks.across_replicas
        lock = auditor.lock(SCOPE)
        assert lock.lock.shared is None
        lock.acquire()
        assert not auditor.locks.local(SCOPE).acquire(blocking=False)  # held in this process
        other = auditor.lock(OTHER)
        other.acquire()
        other.release()
        lock.release()
        assert auditor.locks.local(SCOPE).acquire(blocking=False)
    finally:
        store.close()


# -- the withhold budget and the DP ledger: two services (replicas) on one database ---------------


@dataclass
class Pair:
    root: Path
    keys: dict[str, Ed25519PrivateKey]
    services: list[Service]
    urls: list[str]

    def open(self, replica: int, dataset: str, analyses: list[Analysis]) -> StepResult:
        sealed = seal(
            [to_body(a) for a in analyses],
            self.keys["ada"],
            researcher="ada",
            project="p1",
            dataset=dataset,
            server="pair",
        )
        with connect(self.urls[replica], self.keys["ada"], "ada") as session:
            return session.open(sealed)


@pytest.fixture
def pair(postgres_database: str, tmp_path: Path) -> Iterator[Pair]:
    root = tmp_path / "data"
    initialise(root, server_id="pair", database_url=postgres_database)
    data = DataDir(root)
    keys = {"ada": Ed25519PrivateKey.generate()}
    rules = tmp_path / "budget.yaml"
    rules.write_text("withhold_budget: {count: 1, days: 30}\n")
    census = generate_census(1000, seed=5)
    store = Store(postgres_database)
    try:
        store.add_project("p1")
        pub = keys["ada"].public_key()
        store.add_researcher("ada", public_key_text(pub), fingerprint(pub), ["p1"])
        for name, rules_file in (("budgeted", rules), ("dpdata", None)):
            register_dataset(
                data,
                store,
                name=name,
                frame=census,
                metadata=census_metadata(name),
                project="p1",
                rules_file=rules_file,
            )
    finally:
        store.close()
    dp = ["dataset", "dp", "dpdata", "--epsilon", "1", "--delta", "1e-5"]
    assert server_cli([*dp, "--data-dir", str(root)]) == 0
    with contextlib.ExitStack() as stack:
        services = [stack.enter_context(Service(root)) for _ in range(2)]
        servers = [stack.enter_context(EmbeddedServer(create_app(s))) for s in services]
        yield Pair(root, keys, services, [s.url for s in servers])


def _meet(seconds: float = 8.0) -> Any:
    """A meeting point for the two replicas' requests: each waits there until both arrived (or
    `seconds` passed: with a shared lock, the second cannot arrive before the first is done)."""
    barrier = threading.Barrier(2)

    def meet() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=seconds)

    return meet


def _at_once(pair: Pair, dataset: str, analyses: list[Analysis]) -> list[StepResult | Exception]:
    """The same kind of sequence opened at the same moment through each replica."""
    out: list[StepResult | Exception] = [RuntimeError("not run")] * 2

    def run(i: int) -> None:
        try:
            out[i] = pair.open(i, dataset, analyses)
        except Exception as exc:  # compared below
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("locks", ["shared", "process only"])
def test_openings_at_once_on_two_replicas_respect_the_withhold_budget(
    pair: Pair, monkeypatch: pytest.MonkeyPatch, locks: str
) -> None:
    # Each opening reads the budget, then waits for the other before recording its sequence:
    # both read it before either records, unless the budget's lock makes the second wait.
    real = flow_module.opening_needs_approval
    meet = _meet()

    def slow(*args: Any, **kwargs: Any) -> Any:
        answer = real(*args, **kwargs)
        meet()
        return answer

    monkeypatch.setattr(flow_module, "opening_needs_approval", slow)
    if locks == "process only":  # the control: what replicas did before the shared lock
        for service in pair.services:
            service.flow._budget_locks.across_replicas = False
    # two steps: after step 1 the sequence is still open, a possible withhold (budget 1)
    safe = FrequencyTable(rows=["region"], cols=["sex"])
    results = _at_once(pair, "budgeted", [safe, safe])
    assert all(isinstance(r, StepResult) for r in results), results
    states = sorted(r.status for r in results if isinstance(r, StepResult))
    if locks == "shared":
        assert states == ["pending", "released"]  # one opens; the other waits for a checker
    else:
        assert states == ["released", "released"]  # the budget was overshot


@pytest.mark.slow
@pytest.mark.parametrize("locks", ["shared", "process only"])
def test_dp_steps_at_once_on_two_replicas_are_charged_one_after_the_other(
    pair: Pair, monkeypatch: pytest.MonkeyPatch, locks: str
) -> None:
    # (1, 1e-5) is 0.0718 in sum (Delta/sigma)^2; a count with sigma 5 spends 0.04: one fits.
    real = Flow._dp_context
    meet = _meet()

    def slow(self: Flow, *args: Any) -> Any:
        answer = real(self, *args)
        meet()  # both read the ledger before either records its charge
        return answer

    monkeypatch.setattr(Flow, "_dp_context", slow)
    if locks == "process only":
        for service in pair.services:
            service.flow._dp_locks.across_replicas = False
    results = _at_once(pair, "dpdata", [DPCount(sigma=5.0)])
    store = Store(str(pair.services[0].store.engine.url.render_as_string(False)))
    try:
        ledger = store.dp_ledger("dpdata|researcher|ada")
    finally:
        store.close()
    assert ledger is not None and ledger.releases == 1  # exact either way: never overspent
    if locks == "shared":
        # the second waited, read the charged ledger and was withheld for the budget
        assert sorted(r.status for r in results if isinstance(r, StepResult)) == [
            "released",
            "withheld",
        ]
    else:
        # the second found the ledger changed under it (or its first row made meanwhile):
        # refused, "retry"
        errors = [r for r in results if isinstance(r, ServerError)]
        assert len(errors) == 1 and errors[0].status == 409, results
