"""A queued step answered from its settle's NOTIFY (`store/queue.py`'s `SettledFields`), on a
real PostgreSQL: an API replica (execution = "queue") waits while a worker's flow runs the job
in this process, and its answer is compared with the view built from a fresh read of the rows.

- released, withheld and failed steps: the answer from the announcement is byte for byte the
  answer from the rows, and the replica read nothing while it waited;
- fields too large for a NOTIFY: the announcement is the key alone, the replica reads the rows
  once and answers the same;
- a lost NOTIFY: the replica still answers (its one-second look at the row);
- the announcement itself: only the fields a view reads, and under PostgreSQL's limit;
- the worker's one read of a queued step brings its dataset's settings too;
- a job carries what that read returns: its first attempt reads nothing of the step, a later
  attempt (or a job carrying nothing) reads it, and a first attempt from stale rows records
  nothing.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import event, text

from replica_helpers import one_researcher_centre
from safeaccess.client.analyses import Analysis, FrequencyTable, to_body
from safeaccess.client.protocol import SealedSequence, seal
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.jobs.tasks import make_app
from safeaccess.server.schemas import OpenRequest, RevealRequest, StepView
from safeaccess.server.service import Service
from safeaccess.server.store import Store, sequences
from safeaccess.server.store import queue as job_queue
from safeaccess.server.store.queue import TABLE_TASK
from safeaccess.server.store.schema import ClaimRequirementRow, SequenceRow, StepRow
from safeaccess.server.store.step_settings import StepSettings, settings_of, settings_scope

SAFE = FrequencyTable(rows=["region"], cols=["sex"])
UNSAFE = FrequencyTable(rows=["ethnicity"], cols=["region"])  # "Traveller" cells are tiny
BROKEN = FrequencyTable(rows=["no_such_column"])  # a valid analysis that fails when run


#: Runs a job on the worker, given its args as queued.
Runner = Callable[[dict[str, Any]], None]

#: A read of a step that is not the replica's (the test's own look at the rows): the store's
#: function as it is before the fixture counts the replica's calls of it.
_READ = sequences.get_sequence_step


@dataclass
class Queued:
    """An API replica and a worker's service over one data directory on PostgreSQL."""

    api: Service
    worker: Service
    key: Ed25519PrivateKey
    server_id: str
    #: The replica's reads of a step: (sequence, index, the step's state then or None).
    reads: list[tuple[str, int, str | None]]

    def settled_reads(self) -> list[tuple[str, int, str | None]]:
        """The reads that found a step settled (a read of a running step is the waiter's
        once-a-second look, when the sandbox is slow to start)."""
        return [r for r in self.reads if r[2] not in (None, "running")]

    def seal(self, analyses: list[Analysis]) -> SealedSequence:
        return seal(
            [to_body(a) for a in analyses],
            self.key,
            researcher="ada",
            project="p1",
            dataset="census",
            server=self.server_id,
        )

    def _answered(
        self, ask: Callable[[], StepView], index: int, run: Runner | None = None
    ) -> StepView:
        """`ask` on the replica (it waits for the step) while the worker runs the step's job
        (`run` given the job's args; default: the worker's flow, reading the rows)."""
        answers: list[StepView] = []
        errors: list[BaseException] = []

        def asking_replica() -> None:
            try:
                answers.append(ask())
            except BaseException as exc:  # reported below, on the test's thread
                errors.append(exc)

        asking = threading.Thread(target=asking_replica)
        asking.start()
        job_id, sequence_id, args = self._job(index)
        if run is None:
            assert self.worker.flow.run_job(sequence_id, index)
        else:
            run(args)
        with self.api.store.transaction() as s:  # done with (as a worker's finish would)
            s.execute(text("DELETE FROM procrastinate_jobs WHERE id = :id"), {"id": job_id})
        asking.join(timeout=30)
        assert not errors, errors
        assert answers, "the replica did not answer"
        return answers[0]

    def _job(self, index: int) -> tuple[int, str, dict[str, Any]]:
        """The id, sequence and args of the waiting job for step `index`, once it is queued."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with self.api.store.transaction() as s:
                found = s.execute(
                    text(
                        "SELECT id, args->>'sequence_id', args FROM procrastinate_jobs "
                        "WHERE status = 'todo' AND (args->>'index')::int = :index "
                        "ORDER BY id DESC LIMIT 1"
                    ),
                    {"index": index},
                ).first()
            if found is not None:
                return int(found[0]), str(found[1]), dict(found[2])
            time.sleep(0.02)
        raise AssertionError("no job was queued")

    def open(self, sealed: SealedSequence, run: Runner | None = None) -> StepView:
        trace, body = sealed.reveal_for(1)
        request = OpenRequest.model_validate(
            {
                "header": base64.b64encode(sealed.header).decode(),
                "signature": base64.b64encode(sealed.signature).decode(),
                "trace": trace.hex(),
                "body": base64.b64encode(body).decode(),
            }
        )
        return self._answered(lambda: self.api.flow.open_sequence("ada", request), 1, run)

    def reveal(
        self, sequence_id: str, sealed: SealedSequence, index: int, run: Runner | None = None
    ) -> StepView:
        trace, body = sealed.reveal_for(index)
        request = RevealRequest.model_validate(
            {"trace": trace.hex(), "body": base64.b64encode(body).decode()}
        )
        return self._answered(
            lambda: self.api.flow.reveal("ada", sequence_id, index, request), index, run
        )

    def read_answer(self, sequence_id: str, index: int) -> StepView:
        """The step's view from the rows as they are now (not counted as the replica's read)."""
        seq, step = _READ(self.api.store, sequence_id, index)
        assert seq is not None and step is not None
        return self.api.views.step(seq, step)


@pytest.fixture
def queued(
    postgres_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Queued]:
    key = Ed25519PrivateKey.generate()
    root = tmp_path / "data"
    server_id = one_researcher_centre(
        root,
        postgres_database,
        key,
        server_id="queued",
        dataset="census",
        frame=generate_census(2000, seed=5),
        metadata=census_metadata("census"),
        execution="queue",
    ).server_id
    worker = Service(root, role="worker")
    api = Service(root, backend=worker.backend)
    reads: list[tuple[str, int, str | None]] = []

    def counted(store: Any, sequence_id: str, index: int) -> Any:
        seq, step = _READ(store, sequence_id, index)
        if store is api.store:  # the replica's reads, not the worker's
            reads.append((sequence_id, index, None if step is None else step.state))
        return seq, step

    monkeypatch.setattr(sequences, "get_sequence_step", counted)
    try:
        assert api.flow.listener is not None and api.flow.listener.listening.wait(10)
        yield Queued(api=api, worker=worker, key=key, server_id=server_id, reads=reads)
    finally:
        assert api.flow.listener is not None
        api.flow.listener.close()
        api.scripts.close()
        api.store.close()
        worker.close()  # the sandbox backend both use


def test_released_withheld_and_failed_steps_are_answered_from_the_announcement(
    queued: Queued,
) -> None:
    sealed = queued.seal([SAFE, UNSAFE])
    first = queued.open(sealed)
    assert first.state == "released" and first.receipt is not None
    # Opened and queued by this request: the NOTIFY answered, the settled step was not read.
    assert queued.settled_reads() == []
    assert first.model_dump_json() == queued.read_answer(first.sequence_id, 1).model_dump_json()

    second = queued.reveal(first.sequence_id, sealed, 2)
    assert second.state == "withheld" and second.reasons and second.receipt is not None
    # The reveal's own read of the sequence (no step 2 yet); none after the settle.
    assert (first.sequence_id, 2, None) in queued.reads and queued.settled_reads() == []
    assert second.model_dump_json() == queued.read_answer(first.sequence_id, 2).model_dump_json()

    broken = queued.open(queued.seal([BROKEN]))
    assert broken.state == "failed" and broken.error is not None and broken.error.message
    assert queued.settled_reads() == []
    assert broken.model_dump_json() == queued.read_answer(broken.sequence_id, 1).model_dump_json()


def test_a_view_too_large_for_a_notify_is_read_and_answered_the_same(
    queued: Queued, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every view too large (a region-by-sex table's is about 1.1 kB; the limit's own edge is
    # tested below, without a database).
    monkeypatch.setattr(job_queue, "NOTIFY_LIMIT", 100)
    view = queued.open(queued.seal([SAFE]))
    assert view.state == "released" and view.output is not None
    seq, step = _READ(queued.api.store, view.sequence_id, 1)
    assert seq is not None and step is not None
    # The settle's fields do not fit: the announcement says "read", and the replica did.
    assert job_queue.announcement(seq.id, 1, (seq, step)) == f"{seq.id}:1"
    assert queued.settled_reads() == [(seq.id, 1, "released")]
    assert view.model_dump_json() == queued.read_answer(seq.id, 1).model_dump_json()


def test_a_lost_notify_still_answers(queued: Queued, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_queue, "notify_settled", lambda *args, **kwargs: None)
    start = time.monotonic()
    view = queued.open(queued.seal([SAFE]))
    assert view.state == "released"
    # Found by the waiter's look at the row, a second after it began to wait.
    assert queued.settled_reads() == [(view.sequence_id, 1, "released")]
    assert time.monotonic() - start >= 0.9
    assert view.model_dump_json() == queued.read_answer(view.sequence_id, 1).model_dump_json()


def _rows(output: dict[str, Any] | None) -> tuple[SequenceRow, StepRow]:
    now = datetime(2026, 11, 28, 1, 2, 3, 456789, tzinfo=UTC)
    seq = SequenceRow(
        id="s" * 32,
        researcher="ada",
        project="p1",
        dataset_id=1,
        header=b"h" * 2000,
        header_hash="a" * 64,
        nonce="n",
        signature=b"s" * 64,
        endorsements=[],
        state="released",
        current_index=1,
        verifier_state={"big": "v" * 2000},
        version=3,
        created_at=now,
        updated_at=now,
    )
    step = StepRow(
        id=7,
        sequence_id=seq.id,
        index=1,
        trace_hash="t" * 64,
        body=b"b" * 3000,
        body_hash="c" * 64,
        last=False,
        kind="frequency_table",
        state="released",
        output={"facts": "never leaves the centre"},
        public_output=output,
        run_event=None,
        output_hash="d" * 64,
        decision=None,
        ruleset_hash="e" * 64,
        error_code=None,
        error_message=None,
        backend="process",
        wall_seconds=0.0123,
        output_salt=b"\x01\x02",
        log_index=42,
        reviewer=None,
        review_note=None,
        created_at=now,
        updated_at=now,
    )
    return seq, step


def test_the_announcement_carries_only_what_a_view_reads_and_fits_the_limit() -> None:
    seq, step = _rows({"values": [[1.5, 2.0]], "label": "caf\u00e9"})
    payload = job_queue.announcement(seq.id, 1, (seq, step))
    key, fields = job_queue.parse_announcement(payload)
    assert key == f"{seq.id}:1" and fields is not None and payload.isascii()
    # Not the full output, the run's backend or time, the sequence's header or the body.
    for secret in ("never leaves", "process", "0.0123", "hhhh", "vvvv", "bbbb"):
        assert secret not in payload
    rebuilt = job_queue.settled_rows(fields, seq, step)
    assert rebuilt is not None
    latest, row = rebuilt
    assert row.public_output == step.public_output and row.output_salt == step.output_salt
    assert (row.log_index, row.created_at, row.updated_at) == (42, step.created_at, step.updated_at)
    assert (latest.state, latest.version, latest.header_hash) == ("released", 3, seq.header_hash)

    # Just under PostgreSQL's limit it is carried; at the limit it is left out.
    room = job_queue.NOTIFY_LIMIT - 1 - len(payload) + len("caf\\u00e9")
    seq, step = _rows({"values": [[1.5, 2.0]], "label": "x" * room})
    assert len(job_queue.announcement(seq.id, 1, (seq, step))) == job_queue.NOTIFY_LIMIT - 1
    seq, step = _rows({"values": [[1.5, 2.0]], "label": "x" * (room + 1)})
    assert job_queue.announcement(seq.id, 1, (seq, step)) == f"{seq.id}:1"
    # A value JSON cannot carry exactly: no fields (the settle goes on, the waiter reads).
    for odd in (float("nan"), float("inf")):
        seq, step = _rows({"values": [[odd]]})
        assert job_queue.announcement(seq.id, 1, (seq, step)) == f"{seq.id}:1"
    # Fields that do not parse (another release's payload) send the waiter to the row.
    assert job_queue.settled_rows('{"state": 1}', seq, step) is None


def test_the_workers_one_read_brings_the_step_and_its_datasets_settings(
    queued: Queued, monkeypatch: pytest.MonkeyPatch
) -> None:
    view = queued.open(queued.seal([SAFE]))
    store = queued.worker.store
    # Settings with several rows to join: two claims for one kind, one for another, DP.
    with store.transaction() as s:
        for kind, claim in (("ols", "ethics"), ("ols", "training"), ("logit", "ethics")):
            s.add(ClaimRequirementRow(dataset="census", kind=kind, claim=claim))
    store.set_dp_config("census", {"epsilon": 1.0, "delta": 1e-5})
    expected_seq, expected_step = Store.get_sequence_step(store, view.sequence_id, 1)
    assert expected_seq is not None and expected_step is not None
    expected = StepSettings.read(store, expected_seq.dataset_id)
    assert expected is not None and expected.requirements["ols"] == {"ethics", "training"}

    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(args[2])

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        with settings_scope(store):
            seq, step = store.get_sequence_step(view.sequence_id, 1)
            # Kept by the scope: what the job asks for next is answered without a statement.
            assert settings_of(store, expected_seq.dataset_id) == expected
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    assert len(statements) == 1, statements
    assert seq is not None and step is not None
    assert (seq.id, seq.version, seq.state) == (
        expected_seq.id,
        expected_seq.version,
        expected_seq.state,
    )
    assert (step.id, step.body, step.state) == (expected_step.id, expected_step.body, "released")
    # No such sequence, or no such step yet: as `get_sequence_step` answers.
    assert store.get_sequence_step("0" * 32, 1) == (None, None)
    assert store.get_sequence_step(view.sequence_id, 2)[1] is None


# -- the job carries what the worker's read returns (`queue.Carried`) ---------------------------


def _reads_of_the_step(statements: list[str]) -> list[str]:
    """The statements that read a sequence, a step or a dataset's settings (the worker's read)."""
    return [
        sql
        for sql in statements
        if sql.lstrip().upper().startswith("SELECT")
        and any(table in sql for table in ("sequences", "steps", "qss_settings", "dp_config"))
    ]


@contextlib.contextmanager
def _statements(store: Store) -> Iterator[list[str]]:
    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(args[2])

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(store.engine, "before_cursor_execute", record)


def _task(queued: Queued, attempts: int) -> Runner:
    """The worker's task (`jobs/tasks.py`) run as procrastinate would, as attempt `attempts`."""
    app = make_app("dbname=unused", 1)
    task = app.tasks[TABLE_TASK]
    context = SimpleNamespace(
        job=SimpleNamespace(attempts=attempts),
        additional_context={
            "service": queued.worker,
            "datasets": SimpleNamespace(verify=lambda dataset: None),
        },
    )
    return lambda args: task.func(context, **args)


def test_a_jobs_first_attempt_computes_and_settles_reading_nothing_of_the_step(
    queued: Queued,
) -> None:
    sealed = queued.seal([SAFE, UNSAFE])
    # Warm the worker (its dataset row, the rule set's log entry) with a first sequence.
    queued.open(queued.seal([SAFE]))
    carried: list[dict[str, Any]] = []

    def first_attempt(args: dict[str, Any]) -> None:
        carried.append(args["carried"])
        with _statements(queued.worker.store) as statements:
            _task(queued, attempts=0)(args)
        assert _reads_of_the_step(statements) == []

    first = queued.open(sealed, run=first_attempt)
    assert first.state == "released"
    assert first.model_dump_json() == queued.read_answer(first.sequence_id, 1).model_dump_json()
    second = queued.reveal(first.sequence_id, sealed, 2, run=first_attempt)
    assert second.state == "withheld"
    assert second.model_dump_json() == queued.read_answer(first.sequence_id, 2).model_dump_json()
    # The carried sequence was the row as the reveal left it: the settle moved it one on.
    seq, _ = Store.get_sequence_step(queued.api.store, first.sequence_id, 2)
    assert seq is not None and [c["version"] for c in carried] == [seq.version - 3, seq.version - 1]
    # With the settings the reveal read, not read again.
    assert carried[1]["settings"]["dataset_id"] == seq.dataset_id


def test_a_later_attempt_and_a_job_carrying_nothing_read_the_step(queued: Queued) -> None:
    found: dict[str, list[str]] = {}

    def attempt(name: str, attempts: int, strip: bool) -> Runner:
        def run(args: dict[str, Any]) -> None:
            assert "carried" in args
            if strip:  # as queued by an older release, or by a re-sent reveal's `ensure`
                args = {k: v for k, v in args.items() if k != "carried"}
            with _statements(queued.worker.store) as statements:
                _task(queued, attempts)(args)
            found[name] = _reads_of_the_step(statements)

        return run

    sealed = queued.seal([SAFE, SAFE])
    first = queued.open(sealed, run=attempt("second attempt", 1, strip=False))
    assert first.state == "released"
    second = queued.reveal(first.sequence_id, sealed, 2, run=attempt("no fields", 0, strip=True))
    assert second.state == "released"
    assert found["second attempt"] and found["no fields"]
    # Fields of another release, or of another step, are not used: the worker reads.
    assert job_queue.carried_rows({"version": 1}, first.sequence_id, 2) is None
    assert job_queue.carried_rows(None, first.sequence_id, 2) is None


def test_a_first_attempt_from_stale_rows_records_nothing(queued: Queued) -> None:
    sealed = queued.seal([SAFE])
    kept: dict[str, Any] = {}

    def settled_elsewhere(args: dict[str, Any]) -> None:
        kept.update(args)
        assert queued.worker.flow.run_job(args["sequence_id"], args["index"])  # reads

    view = queued.open(sealed, run=settled_elsewhere)
    assert view.state == "released"
    store = queued.api.store
    before = Store.get_sequence_step(store, view.sequence_id, 1)
    with store.transaction() as s:
        log_size = s.execute(text("SELECT count(*) FROM events")).scalar_one()
    # The job run again as a first attempt, carrying the rows as they were when it was queued:
    # the settle is guarded by the carried version, so it records nothing.
    assert not queued.worker.flow.run_job(view.sequence_id, 1, carried=kept["carried"])
    after = Store.get_sequence_step(store, view.sequence_id, 1)
    assert before[0] is not None and after[0] is not None
    assert before[1] is not None and after[1] is not None
    assert (after[0].version, after[0].state) == (before[0].version, before[0].state)
    assert (after[1].state, after[1].log_index, after[1].updated_at) == (
        before[1].state,
        before[1].log_index,
        before[1].updated_at,
    )
    with store.transaction() as s:
        assert s.execute(text("SELECT count(*) FROM events")).scalar_one() == log_size
