"""Replicas that run steps themselves (execution = "local") on one PostgreSQL database: a step
whose replica died mid-step is run again by another replica, without the client asking
(`store/sequence_leases.py`, `steps/orphans.py`). Two services in this process stand for the
two replicas; a replica's death is its lease session ending, which is what PostgreSQL sees when
a process dies."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import create_engine, make_url, text

from replica_helpers import one_researcher_centre, people, people_metadata
from safeaccess.client.analyses import FrequencyTable, to_body
from safeaccess.client.protocol import seal
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.sandbox.backend import Backend, Job, JobCrashed, RunResult
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.steps.orphans import sweep
from safeaccess.server.store import Store
from safeaccess.server.store.running_steps import running_steps
from safeaccess.server.store.sequence_leases import SequenceLeases


class StuckAtStep2:
    """A backend whose step-2 job never finishes until told, then fails as the centre's fault:
    the replica running it is as good as dead."""

    def __init__(self, inner: Backend):
        self.inner = inner
        self.name = inner.name
        self.entered = threading.Event()
        self.go = threading.Event()

    def check_available(self) -> None:
        self.inner.check_available()

    def run(self, job: Job) -> RunResult:
        if job.job_id.endswith("-2"):
            self.entered.set()
            self.go.wait(120)
            raise JobCrashed("the replica was stopped")
        return self.inner.run(job)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def root(postgres_url: str, tmp_path: Path) -> Iterator[tuple[Path, str, Ed25519PrivateKey]]:
    name = f"orphans_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(postgres_url).set(database=name).render_as_string(False)
    root = tmp_path / "data"
    # The process sandbox without a root server: one-shot sandboxes ("warm") are enough here.
    key = Ed25519PrivateKey.generate()
    one_researcher_centre(
        root,
        url,
        key,
        server_id="replicated",
        dataset="people",
        frame=people(),
        metadata=people_metadata("people"),
    )
    try:
        yield root, url, key
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def kill_every_session(url: str) -> None:
    """End every session of the database but this one, as a dead process's sessions end."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
    finally:
        engine.dispose()


def test_a_lease_is_free_once_its_session_ends(postgres_database: str) -> None:
    Store(postgres_database).close()  # the schema
    first, second = SequenceLeases(postgres_database, 1), SequenceLeases(postgres_database, 1)
    try:
        assert first.try_take("s1")
        assert not second.try_take("s1")
        assert second.try_take("s2")  # another sequence is not held up
        first.close()  # its process died: PostgreSQL ends the session and its locks
        deadline = time.monotonic() + 10  # (the server's backend exits a moment later)
        while not second.try_take("s1"):
            assert time.monotonic() < deadline, "the dead session's lease was never freed"
            time.sleep(0.05)
    finally:
        first.close()
        second.close()


def test_a_step_whose_replica_died_is_run_again_by_another_once(
    root: tuple[Path, str, Ed25519PrivateKey],
) -> None:
    path, url, key = root
    analyses = [FrequencyTable(rows=["region"]), FrequencyTable(rows=["sex"])]
    sealed = seal(
        [to_body(a) for a in analyses],
        key,
        researcher="ada",
        project="p1",
        dataset="people",
        server="replicated",
    )
    first_service = Service(path)
    stuck = StuckAtStep2(first_service.backend)
    first_service.backend = stuck
    first_service.flow.backend = stuck
    second = Service(path)
    answer: list[StepResult] = []
    try:
        assert first_service.orphans is not None and second.orphans is not None
        # Only the explicit sweeps below: the services' own sweepers stop.
        first_service.orphans.close()
        second.orphans.close()
        server = EmbeddedServer(create_app(first_service))
        with server, connect(server.url, key, "ada") as session:
            opened = session.open(sealed)
            assert opened.released, opened
            reveal = threading.Thread(
                target=lambda: answer.append(session.reveal(opened.sequence_id, sealed, 2))
            )
            reveal.start()
            assert stuck.entered.wait(60), "step 2 never reached the sandbox"
            # The first replica is alive and computing: the second leaves the step alone.
            assert running_steps(second.store) == [(opened.sequence_id, 2)]
            assert sweep(second.flow) == 0
            # It dies: PostgreSQL ends its sessions (here every session, the second's too,
            # which connects again), and its locks with them. The second runs the step, once.
            kill_every_session(url)
            deadline = time.monotonic() + 30  # (the dead sessions end a moment later)
            while (resumed := sweep(second.flow)) == 0:
                assert time.monotonic() < deadline, "the orphaned step was never run"
                time.sleep(0.1)
            assert resumed == 1
            assert running_steps(second.store) == []
            assert sweep(second.flow) == 0
            # The dead replica's late end records nothing; its client's retry finds the
            # step released.
            stuck.go.set()
            reveal.join(timeout=60)
        assert answer and answer[0].status == "released", answer
        events = Counter(
            event.kind for event in second.store.events(opened.sequence_id) if event.step_index == 2
        )
        settled = [kind for kind, count in events.items() if count != 1]
        assert settled == [], events
    finally:
        stuck.go.set()
        first_service.close()
        second.close()
