"""Dataset affinity in the queue's claim (`store/affinity.py`, `jobs/affinity.py`), on a real
PostgreSQL: a worker takes a waiting step on a dataset it holds warm before an older one on
another dataset, but never before a researcher the fairness rule puts first, and never keeps a
cold dataset's step waiting longer than the affinity window. Without warm datasets the claim is
procrastinate's own, job for job."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import text

from safeaccess.server.jobs.affinity import AffinityJobManager, WarmDatasets
from safeaccess.server.jobs.tasks import make_app
from safeaccess.server.store import Store
from safeaccess.server.store import queue as job_queue
from safeaccess.server.store.queue import STEPS, QueuedJob
from safeaccess.server.store.settled import conninfo

Key = tuple[str, str]


def job(researcher: str, sequence: str, dataset: str, lanes: int = 1) -> QueuedJob:
    return QueuedJob(
        task="safeaccess.run_step",
        queue=STEPS,
        sequence_id=sequence,
        index=1,
        researcher=researcher,
        dataset=dataset,
        lanes=lanes,
    )


def defer(store: Store, *jobs: QueuedJob) -> None:
    with store.transaction() as s:
        for j in jobs:
            job_queue.defer(s, j)


def claim(
    store: Store, *, warm: list[str] | None = None, seconds: float = 60.0, finish: bool = False
) -> Key | None:
    """One claim: procrastinate's own function when `warm` is None, else ours."""
    with store.transaction() as s:
        worker = s.execute(text("SELECT worker_id FROM procrastinate_register_worker_v1()"))
        worker_id = worker.scalar_one()
        if warm is None:
            row = s.execute(
                text("SELECT id, args FROM procrastinate_fetch_job_v2(ARRAY[:q]::varchar[], :w)"),
                {"q": STEPS, "w": worker_id},
            ).one()
        else:
            row = s.execute(
                text(
                    "SELECT id, args FROM safeaccess_fetch_job_v1(ARRAY[:q]::varchar[], :w, "
                    "CAST(:warm AS text[]), :seconds)"
                ),
                {"q": STEPS, "w": worker_id, "warm": warm, "seconds": seconds},
            ).one()
        if row.id is not None and finish:
            s.execute(
                text("SELECT procrastinate_finish_job_v1(:id, 'succeeded', false)"), {"id": row.id}
            )
    if row.id is None:
        return None
    return row.args["researcher"], row.args["sequence_id"]


@pytest.fixture
def store(postgres_database: str) -> Store:
    return Store(postgres_database)


def mixed_jobs() -> list[QueuedJob]:
    """Three researchers, two lanes each, on three datasets, in an interleaved order."""
    jobs = []
    for i in range(4):
        for who, dataset in (("ada", "census"), ("bob", "health"), ("cy", "census")):
            jobs.append(job(who, f"{who}{i}", f"{dataset}{i % 2}", lanes=2))
    return jobs


def claims_until_empty(store: Store, warm: list[str] | None) -> list[Key | None]:
    """Claim and finish, and when every lane is busy, finish nothing: record the whole run."""
    order: list[Key | None] = []
    for _ in range(40):
        got = claim(store, warm=warm, seconds=0.0, finish=True)
        order.append(got)
        if got is None:
            break
    return order


def test_without_warm_datasets_the_claim_is_procrastinates_own(store: Store) -> None:
    jobs = mixed_jobs()
    defer(store, *jobs)
    theirs = claims_until_empty(store, None)
    with store.transaction() as s:
        s.execute(text("DELETE FROM procrastinate_jobs"))
    defer(store, *jobs)
    ours = claims_until_empty(store, [])
    assert theirs[-1] is None and len(theirs) == len(jobs) + 1
    assert ours == theirs


def test_a_warm_dataset_is_claimed_before_an_older_cold_one(store: Store) -> None:
    defer(store, job("ada", "a1", "census"), job("bob", "b1", "health"))
    # Same priority (neither has another job): the worker warm on health takes bob's first.
    assert claim(store, warm=["health"]) == ("bob", "b1")
    assert claim(store, warm=["health"]) == ("ada", "a1")


def test_fairness_between_researchers_comes_before_warmth(store: Store) -> None:
    # Ada's second job has the lower priority (she already has one waiting); warm or not, her
    # first job on the cold dataset, and bob's, go before it.
    defer(
        store,
        job("ada", "a1", "census", lanes=2),
        job("ada", "a2", "health", lanes=2),
        job("bob", "b1", "census", lanes=2),
    )
    assert claim(store, warm=["health"]) == ("ada", "a1")
    assert claim(store, warm=["health"]) == ("bob", "b1")
    assert claim(store, warm=["health"]) == ("ada", "a2")


def test_a_cold_step_waits_no_longer_than_the_affinity_window(store: Store) -> None:
    defer(store, job("ada", "a1", "census"))
    time.sleep(0.4)
    defer(store, job("bob", "b1", "health"))
    # Ada's step has waited past the 0.2 s window: it goes first, warm or not.
    assert claim(store, warm=["health"], seconds=0.2) == ("ada", "a1")
    assert claim(store, warm=["health"], seconds=0.2) == ("bob", "b1")


def test_a_lane_held_by_a_running_job_is_not_jumped_by_warmth(store: Store) -> None:
    # One lane each: bob's second job waits for his first, whatever the worker holds warm.
    defer(store, job("bob", "b1", "census"), job("bob", "b2", "health"))
    assert claim(store, warm=["health"]) == ("bob", "b1")
    assert claim(store, warm=["health"]) is None


def test_the_workers_manager_claims_with_its_warm_datasets_and_remembers_them(
    store: Store, postgres_database: str
) -> None:
    defer(
        store,
        job("ada", "a1", "census"),
        job("bob", "b1", "health"),
        job("cy", "c1", "health"),
    )
    warm = WarmDatasets(size=2)
    warm.note("health")

    async def run() -> list[str]:
        app = make_app(conninfo(postgres_database), max_attempts=3)
        manager = AffinityJobManager(app.connector, warm, affinity_seconds=60.0)
        async with app.open_async():
            worker_id = (
                await app.connector.execute_query_one_async(
                    "SELECT worker_id FROM procrastinate_register_worker_v1()"
                )
            )["worker_id"]
            got = []
            for _ in range(3):
                claimed = await manager.fetch_job([STEPS], worker_id)
                assert claimed is not None
                got.append(str(claimed.task_kwargs["sequence_id"]))
            assert await manager.fetch_job([STEPS], worker_id) is None
            return got

    assert asyncio.run(run()) == ["b1", "c1", "a1"]
    # The claimed datasets are now the warm ones, the latest last.
    assert warm.names() == ["health", "census"]


def test_warm_datasets_keep_the_most_recent_few() -> None:
    warm = WarmDatasets(size=2)
    for name in ("a", "b", "a", "c", ""):
        warm.note(name)
    assert warm.names() == ["a", "c"]
