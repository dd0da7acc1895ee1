"""The job queue's rows on a real PostgreSQL (`store/queue.py`): one job per step, fair order
across researchers, a per-researcher cap in procrastinate's own claim, and the settings that
refuse a queue without PostgreSQL. The worker processes themselves run in tests/cluster/."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from safeaccess.server.admin.cli import main as cli_main
from safeaccess.server.config import ServerConfig, initialise
from safeaccess.server.jobs.pruning import prune_finished
from safeaccess.server.jobs.tasks import make_app
from safeaccess.server.store import Store
from safeaccess.server.store import queue as job_queue
from safeaccess.server.store.queue import SCRIPTS, STEPS, QueuedJob, step_job
from safeaccess.server.store.settled import SettledListener, conninfo


def job(researcher: str, sequence: str, index: int = 1, lanes: int = 1) -> QueuedJob:
    return QueuedJob(
        task="safeaccess.run_step",
        queue=STEPS,
        sequence_id=sequence,
        index=index,
        researcher=researcher,
        lanes=lanes,
    )


def claim(store: Store) -> tuple[str, str] | None:
    """Claim the next job as a procrastinate worker does (its own SQL function)."""
    with store.transaction() as s:
        worker = s.execute(text("SELECT worker_id FROM procrastinate_register_worker_v1()"))
        worker_id = worker.scalar_one()
        row = s.execute(
            text("SELECT id, args FROM procrastinate_fetch_job_v2(ARRAY[:queue]::varchar[], :w)"),
            {"queue": STEPS, "w": worker_id},
        ).one()
    if row.id is None:
        return None
    return row.args["researcher"], row.args["sequence_id"]


def _ensure(store: Store, queued: QueuedJob) -> bool:
    with store.transaction() as s:
        return job_queue.ensure(s, queued)


def _status(store: Store, key: str) -> str | None:
    with store.transaction() as s:
        return job_queue.job_status(s, key)


@pytest.fixture
def store(postgres_database: str) -> Store:
    return Store(postgres_database)


def test_a_step_has_one_job_however_often_it_is_queued(store: Store) -> None:
    first = job("ada", "s1")
    with store.transaction() as s:
        job_queue.defer(s, first)
    # A re-sent reveal, or two replicas at once, find the job that waits.
    assert _ensure(store, first) is False
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(_ensure(store, first))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [False, False]
    assert _status(store, first.key) == "todo"
    with store.transaction() as s:
        count = s.execute(
            text("SELECT count(*) FROM procrastinate_jobs WHERE queueing_lock = :k"),
            {"k": first.key},
        ).scalar_one()
    assert count == 1
    # A job that failed (its sandbox unavailable every time) is queued again by a re-sent reveal.
    with store.transaction() as s:
        s.execute(text("UPDATE procrastinate_jobs SET status = 'failed'"))
    assert _ensure(store, first) is True
    assert _status(store, first.key) == "todo"


def test_the_researcher_with_fewest_jobs_is_served_first_and_each_is_capped(
    store: Store,
) -> None:
    # Bob queues five jobs, then Ada one: Ada's is claimed right after Bob's first.
    with store.transaction() as s:
        for i in range(5):
            job_queue.defer(s, job("bob", f"b{i}", lanes=2))
        job_queue.defer(s, job("ada", "a0", lanes=2))
    order = [claim(store) for _ in range(4)]
    assert order[0] == ("bob", "b0")
    assert order[1] == ("ada", "a0")
    assert order[2] == ("bob", "b1")
    # Bob's cap is two at once (two lanes): with b0 and b1 running, b2 waits for a lane.
    assert order[3] is None
    with store.transaction() as s:
        s.execute(
            text(
                "UPDATE procrastinate_jobs SET status = 'succeeded' "
                "WHERE args->>'sequence_id' = 'b0'"
            )
        )
    assert claim(store) == ("bob", "b2")


def test_her_own_waiting_scripts_never_hold_up_her_table(store: Store) -> None:
    script = job("bob", "s-script").model_copy(update={"queue": SCRIPTS, "task": "t"})
    with store.transaction() as s:
        job_queue.defer(s, script)
        job_queue.defer(s, job("bob", "s-table"))
    # The script is claimed (running) and holds bob's only script lane; his table still goes.
    with store.transaction() as s:
        worker = s.execute(text("SELECT worker_id FROM procrastinate_register_worker_v1()"))
        s.execute(
            text("SELECT id FROM procrastinate_fetch_job_v2(ARRAY[:q]::varchar[], :w)"),
            {"q": SCRIPTS, "w": worker.scalar_one()},
        )
    assert claim(store) == ("bob", "s-table")


def test_scripts_go_to_their_own_queue_and_pools_to_theirs(tmp_path: Path) -> None:
    config = ServerConfig(
        server_id="c",
        database_url="postgresql+psycopg://u@h/db",
        execution="queue",
        queue={"pools": {"big": "large"}},
    )
    kwargs = {"sequence_id": "s", "index": 2, "researcher": "ada"}
    assert step_job(config, dataset="census", script=True, **kwargs).queue == SCRIPTS
    assert step_job(config, dataset="census", script=False, **kwargs).queue == STEPS
    assert step_job(config, dataset="big", script=False, **kwargs).queue == "steps.large"
    assert step_job(config, dataset="big", script=False, **kwargs).key == "step:s:2"


def test_a_queue_needs_postgresql_and_a_worker_needs_the_queue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="needs the job queue's database"):
        ServerConfig(server_id="c", execution="queue")
    root = tmp_path / "data"
    initialise(root, server_id="c")  # SQLite, execution local
    code = cli_main(["worker", "--data-dir", str(root)])
    assert code != 0
    assert "execution" in capsys.readouterr().err


def test_a_waiting_replica_is_woken_by_the_settle(store: Store, postgres_database: str) -> None:
    listener = SettledListener(postgres_database)
    try:
        settled = threading.Event()
        woke: list[float] = []

        def wait() -> None:
            assert listener.wait("s9", 3, timeout=30, done=settled.is_set)
            woke.append(time.monotonic())

        waiting = threading.Thread(target=wait)
        waiting.start()
        time.sleep(0.3)  # the waiter has looked once and sleeps until a NOTIFY or 1 s
        settled.set()
        with store.transaction() as s:
            job_queue.notify_settled(s, "s9", 3)
        notified = time.monotonic()
        waiting.join(timeout=10)
        # Woken by the NOTIFY, well before its next look at the row (1 s after the first).
        assert woke and woke[0] - notified < 0.5, woke
    finally:
        listener.close()


def test_a_replica_that_queued_the_step_reads_it_only_once_it_is_announced(
    store: Store, postgres_database: str
) -> None:
    listener = SettledListener(postgres_database)
    try:
        looks: list[str] = []
        settled = threading.Event()

        def done(key: str) -> bool:
            looks.append(key)
            return settled.is_set()

        # Announced before the request registered (a worker faster than the replica): the
        # listener remembers it, so the first look comes at once and finds the step settled.
        assert listener.listening.wait(10)
        settled.set()
        with store.transaction() as s:
            job_queue.notify_settled(s, "s10", 1)
        time.sleep(0.3)  # the listener has the announcement
        start = time.monotonic()
        assert listener.wait("s10", 1, timeout=30, done=lambda: done("s10"), look_first=False)
        assert time.monotonic() - start < 0.5 and looks == ["s10"]

        # Not announced yet: no look at the row until the announcement (or the 1 s recheck).
        settled.clear()
        woke: list[bool] = []
        waiting = threading.Thread(
            target=lambda: woke.append(
                listener.wait("s11", 1, timeout=30, done=lambda: done("s11"), look_first=False)
            )
        )
        waiting.start()
        time.sleep(0.3)
        assert looks == ["s10"], "the waiter read the row before its step was announced"
        settled.set()
        with store.transaction() as s:
            job_queue.notify_settled(s, "s11", 1)
        waiting.join(timeout=10)
        assert woke == [True] and looks == ["s10", "s11"]
    finally:
        listener.close()


def test_finished_jobs_are_deleted_after_the_kept_hours_and_no_other(
    store: Store, postgres_database: str
) -> None:
    ids = {}
    with store.transaction() as s:
        for name in ("old_done", "old_failed", "new_done", "old_waiting"):
            ids[name] = job_queue.defer(s, job("ada", name))
        for name, status in (
            ("old_done", "succeeded"),
            ("old_failed", "failed"),
            ("new_done", "succeeded"),
        ):
            s.execute(
                text("UPDATE procrastinate_jobs SET status = 'doing' WHERE id = :id"),
                {"id": ids[name]},
            )
            s.execute(
                text("SELECT procrastinate_finish_job_v1(:id, :status, false)"),
                {"id": ids[name], "status": status},
            )
        for name in ("old_done", "old_failed", "old_waiting"):
            s.execute(
                text(
                    "UPDATE procrastinate_events SET at = now() - interval '200 hours' "
                    "WHERE job_id = :id"
                ),
                {"id": ids[name]},
            )

    async def prune() -> None:
        app = make_app(conninfo(postgres_database), max_attempts=1)
        async with app.open_async():
            await prune_finished(app, keep_hours=168)

    asyncio.run(prune())
    with store.transaction() as s:
        left = set(s.execute(text("SELECT id FROM procrastinate_jobs")).scalars())
    assert left == {ids["new_done"], ids["old_waiting"]}
