"""The store: one transaction per state change, replays refused, bad moves change nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, event, func, select, text

from safeaccess.server.config import QssSettings
from safeaccess.server.dataset_rules import current_rules_path
from safeaccess.server.errors import Conflict, InvalidRequest, NotFound
from safeaccess.server.outcome import QssCommit, StepOutcome
from safeaccess.server.states import IllegalTransition, StepState
from safeaccess.server.steps import claims as claim_gate
from safeaccess.server.store import Store, catalogue, review, sequences
from safeaccess.server.store.schema import Base, EventRow, SequenceRow, StepRow
from safeaccess.server.store.step_settings import settings_of, settings_scope


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The same tests on the embedded SQLite and on a real PostgreSQL (fresh schema each)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        url = request.getfixturevalue("postgres_url")
        engine = create_engine(url)
        Base.metadata.drop_all(engine)
        with engine.begin() as connection:  # and the schema's revision: a fresh database
            connection.execute(text("DROP TABLE IF EXISTS alembic_version"))
        engine.dispose()
    s = Store(url)
    s.add_project("p")
    s.add_researcher("ada", "PEM", "fp-ada", ["p"])
    catalogue.add_dataset(
        s,
        name="d",
        version=1,
        project="p",
        path="d.parquet",
        sha256="0" * 64,
        rows=10,
        metadata={"name": "d"},
        rules_path=None,
    )
    yield s
    s.close()


def _open(
    store: Store, seq_id: str = "a" * 32, header: bytes = b"h1", last: bool = False
) -> tuple[SequenceRow, StepRow]:
    step = StepRow(index=1, trace_hash="t1", body=b"b1", body_hash="bh1", last=last)
    return sequences.create_sequence(
        store,
        sequence_id=seq_id,
        researcher="ada",
        project="p",
        dataset_id=1,
        header=header,
        header_hash=f"hash-{header.decode()}",
        nonce=f"n-{header.decode()}",
        signature=b"s",
        endorsements=[],
        verifier_state={"next_index": 2},
        first_step=step,
        event_data={},
    )


def _count_events(store: Store) -> int:
    with store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(EventRow)) or 0)


def test_open_creates_a_running_sequence_and_step_with_an_event(store: Store) -> None:
    before = _count_events(store)
    seq, step = _open(store)
    assert (seq.state, seq.current_index, step.state) == ("running", 1, "running")
    # One transaction, three audit records: the header, the reveal of step 1, its run.
    assert _count_events(store) == before + 3
    kinds = [e.kind for e in store.events(seq.id)]
    assert kinds == ["sequence_opened", "step_revealed", "run_started"]


def test_a_header_is_accepted_once(store: Store) -> None:
    _open(store)
    with pytest.raises(Conflict) as info:
        _open(store, seq_id="b" * 32)
    assert info.value.code == "header_replayed"
    assert store.get_sequence("b" * 32) is None


def test_settle_release_then_reveal_next_then_withhold_aborts(store: Store) -> None:
    seq, _ = _open(store)
    seq, step = sequences.settle_step(store, seq.id, 1, StepOutcome(state=StepState.RELEASED), {})
    assert (seq.state, step.state) == ("released", "released")
    nxt = StepRow(index=2, trace_hash="t2", body=b"b2", body_hash="bh2", last=False)
    sequences.begin_step(
        store, seq.id, expected_version=seq.version, step=nxt, verifier_state={}, event_data={}
    )
    seq, step = sequences.settle_step(store, seq.id, 2, StepOutcome(state=StepState.WITHHELD), {})
    assert (seq.state, step.state) == ("aborted", "withheld")
    third = StepRow(index=3, trace_hash="t3", body=b"b3", body_hash="bh3", last=True)
    with pytest.raises(Conflict):
        sequences.begin_step(
            store,
            seq.id,
            expected_version=seq.version,
            step=third,
            verifier_state={},
            event_data={},
        )
    assert store.get_step(seq.id, 3) is None


def test_reveal_before_release_changes_nothing(store: Store) -> None:
    seq, _ = _open(store)
    events = _count_events(store)
    nxt = StepRow(index=2, trace_hash="t2", body=b"b2", body_hash="bh2", last=False)
    with pytest.raises(Conflict) as info:
        sequences.begin_step(
            store, seq.id, expected_version=seq.version, step=nxt, verifier_state={}, event_data={}
        )
    assert info.value.code == "not_released"
    assert store.get_step(seq.id, 2) is None
    assert _count_events(store) == events
    assert store.get_sequence(seq.id).state == "running"  # type: ignore[union-attr]


def test_a_stale_version_loses(store: Store) -> None:
    seq, _ = _open(store)
    seq, _ = sequences.settle_step(store, seq.id, 1, StepOutcome(state=StepState.RELEASED), {})
    nxt = StepRow(index=2, trace_hash="t2", body=b"b2", body_hash="bh2", last=False)
    with pytest.raises(Conflict) as info:
        sequences.begin_step(
            store,
            seq.id,
            expected_version=seq.version - 1,
            step=nxt,
            verifier_state={},
            event_data={},
        )
    assert info.value.code == "concurrent_update"


def test_concurrent_reveals_only_one_wins(store: Store) -> None:
    seq, _ = _open(store)
    seq, _ = sequences.settle_step(store, seq.id, 1, StepOutcome(state=StepState.RELEASED), {})
    outcomes: list[str] = []

    def attempt() -> None:
        step = StepRow(index=2, trace_hash="t2", body=b"b2", body_hash="bh2", last=False)
        try:
            sequences.begin_step(
                store,
                seq.id,
                expected_version=seq.version,
                step=step,
                verifier_state={},
                event_data={},
            )
            outcomes.append("won")
        except Conflict:
            outcomes.append("lost")

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["lost", "lost", "lost", "won"]


def test_settling_twice_is_illegal_and_keeps_the_first_result(store: Store) -> None:
    seq, _ = _open(store, last=True)
    sequences.settle_step(
        store, seq.id, 1, StepOutcome(state=StepState.RELEASED, output={"x": 1}), {}
    )
    with pytest.raises(Conflict):
        sequences.settle_step(store, seq.id, 1, StepOutcome(state=StepState.WITHHELD), {})
    step = store.get_step(seq.id, 1)
    assert step is not None and step.state == "released" and step.output == {"x": 1}
    assert store.get_sequence(seq.id).state == "finished"  # type: ignore[union-attr]


def test_review_approve_and_reject(store: Store) -> None:
    seq, _ = _open(store)
    sequences.settle_step(store, seq.id, 1, StepOutcome(state=StepState.REVIEW), {})
    assert [s.index for _, s in review.review_queue(store)] == [1]
    seq, step = review.decide_review(
        store, seq.id, 1, approve=True, reviewer="carol", note="ok", event_data={}
    )
    assert (seq.state, step.state, step.reviewer) == ("released", "released", "carol")
    assert review.review_queue(store) == []
    with pytest.raises(Conflict):
        review.decide_review(
            store, seq.id, 1, approve=False, reviewer="carol", note="", event_data={}
        )

    seq2, _ = _open(store, seq_id="c" * 32, header=b"h2")
    sequences.settle_step(store, seq2.id, 1, StepOutcome(state=StepState.REVIEW), {})
    seq2, step2 = review.decide_review(
        store, seq2.id, 1, approve=False, reviewer="dan", note="no", event_data={}
    )
    assert (seq2.state, step2.state) == ("aborted", "withheld")


def test_illegal_step_transition_rolls_back(store: Store) -> None:
    seq, _ = _open(store)
    with pytest.raises(IllegalTransition):
        sequences.settle_step(store, seq.id, 1, StepOutcome(state=StepState.RUNNING), {})
    assert store.get_sequence(seq.id).state == "running"  # type: ignore[union-attr]


def test_the_audit_state_pointer_moves_with_the_step_outcome(store: Store) -> None:
    seq, _ = _open(store)
    first = QssCommit(scope="d/project/p", base=None, digest="a" * 64, n_records=10)
    sequences.settle_step(store, seq.id, 1, StepOutcome(state=StepState.RELEASED), {}, qss=first)
    pointer = store.qss_pointer("d/project/p")
    assert pointer is not None and (pointer.digest, pointer.n_records, pointer.admitted) == (
        "a" * 64,
        10,
        1,
    )
    assert store.qss_pointer("d/project/other") is None


def test_a_pointer_moved_meanwhile_refuses_the_whole_step(store: Store) -> None:
    # Another admission (another replica) moved the scope's state after this step was admitted
    # against the old one: nothing of the step is recorded, the caller admits again.
    seq, _ = _open(store)
    sequences.settle_step(
        store,
        seq.id,
        1,
        StepOutcome(state=StepState.RELEASED),
        {},
        qss=QssCommit(scope="s", base=None, digest="a" * 64, n_records=10),
    )
    seq2, _ = _open(store, seq_id="d" * 32, header=b"h3")
    stale = QssCommit(scope="s", base=None, digest="b" * 64, n_records=10)
    with pytest.raises(Conflict) as caught:
        sequences.settle_step(
            store, seq2.id, 1, StepOutcome(state=StepState.RELEASED), {}, qss=stale
        )
    assert caught.value.code == "qss_state_changed"
    assert store.get_step(seq2.id, 1).state == "running"  # type: ignore[union-attr]
    assert store.qss_pointer("s").digest == "a" * 64  # type: ignore[union-attr]
    fresh = QssCommit(scope="s", base="a" * 64, digest="b" * 64, n_records=12)
    sequences.settle_step(store, seq2.id, 1, StepOutcome(state=StepState.RELEASED), {}, qss=fresh)
    assert store.qss_pointer("s").admitted == 2  # type: ignore[union-attr]


def test_qss_settings_default_and_scope_is_fixed(store: Store) -> None:
    assert store.qss_settings("d") == QssSettings()
    catalogue.add_dataset(
        store,
        name="e",
        version=1,
        project="p",
        path="e.parquet",
        sha256="0" * 64,
        rows=10,
        metadata={"name": "e"},
        rules_path=None,
        qss=QssSettings(mode="atoms", scope="dataset"),
    )
    assert store.qss_settings("e") == QssSettings(mode="atoms", scope="dataset")
    assert catalogue.resolve_qss_settings(store, "e", None) == QssSettings(
        mode="atoms", scope="dataset"
    )
    with pytest.raises(InvalidRequest, match="scope cannot change"):
        catalogue.resolve_qss_settings(store, "e", QssSettings(scope="project"))


def test_nonces_are_remembered_until_they_expire(store: Store) -> None:
    import time

    now = int(time.time())
    assert store.remember_nonce("ada", "n1", now + 100)
    assert not store.remember_nonce("ada", "n1", now + 100)
    assert store.remember_nonce("bob", "n1", now + 100)
    assert store.remember_nonce("ada", "old", now - 1)
    # An expired nonce is purged on the next insert; by then its timestamp is stale anyway.
    assert store.remember_nonce("ada", "n2", now + 100)
    assert store.remember_nonce("ada", "old", now + 100)


def test_unknown_project_for_researcher(store: Store) -> None:
    with pytest.raises(NotFound):
        store.add_researcher("bob", "PEM", "fp", ["nope"])
    assert store.get_researcher("bob") is None


def test_dataset_versions(store: Store) -> None:
    assert catalogue.next_dataset_version(store, "d") == 2
    with pytest.raises(Conflict):
        catalogue.add_dataset(
            store,
            name="d",
            version=1,
            project="p",
            path="x",
            sha256="0",
            rows=1,
            metadata={},
            rules_path=None,
        )
    assert store.find_dataset("d").version == 1  # type: ignore[union-attr]
    assert [d.name for d in catalogue.datasets_for(store, "ada")] == ["d"]


def _statements(store: Store) -> list[str]:
    """The statements `store` sends from now on (until the test ends)."""
    sent: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    return sent


def test_a_steps_settings_are_read_in_one_statement_once_per_request(store: Store) -> None:
    # Version 2 registered first: the versions' ids are not in the order of their versions.
    catalogue.add_dataset(
        store,
        name="e",
        version=2,
        project="p",
        path="e2.parquet",
        sha256="0" * 64,
        rows=10,
        metadata={"name": "e"},
        rules_path=None,
    )
    catalogue.add_dataset(
        store,
        name="e",
        version=1,
        project="p",
        path="e.parquet",
        sha256="0" * 64,
        rows=10,
        metadata={"name": "e"},
        rules_path=None,
        qss=QssSettings(mode="atoms", scope="dataset", atom_cap=7),
    )
    row = store.find_dataset("e", 1)
    assert row is not None
    store.set_dp_config("e", {"scope": "project", "epsilon": 1.0})
    claim_gate.require_claim(store, "e", "crosstab", "ethics")
    claim_gate.require_claim(store, "e", "crosstab", "training")
    claim_gate.require_claim(store, "e", "regression", "ethics")
    with store.transaction() as s:
        catalogue.set_rules_path(s, row.id, "datasets/e/v1.rules.yaml")
    # Read one by one, outside a request's scope: what the one statement must agree with.
    single = (
        current_rules_path(store, row.id),
        store.qss_settings("e"),
        store.get_dp_config("e"),
        claim_gate.requirements(store, "e"),
        catalogue.version_ids(store, "e"),
    )
    assert single[0] == "datasets/e/v1.rules.yaml"
    assert len(single[4]) == 2 and single[4][0] == row.id
    assert single[3] == {"crosstab": frozenset({"ethics", "training"}), "regression": {"ethics"}}
    sent = _statements(store)
    with settings_scope(store):
        scoped = (
            current_rules_path(store, row.id),
            store.qss_settings("e"),
            store.get_dp_config("e"),
            claim_gate.requirements(store, "e"),
            catalogue.version_ids(store, "e"),
        )
        again = (current_rules_path(store, row.id), store.get_dp_config("e"))
        # What a step's claim gate reads (`Flow._settings`): the same requirements by version.
        by_version = settings_of(store, row.id)
        assert by_version is not None and by_version.requirements == single[3]
    assert scoped == single
    assert again == (single[0], single[2])
    assert len(sent) == 1, sent
    # The next request reads again: an administrator's change applies from the next step on.
    store.set_dp_config("e", {"scope": "project", "epsilon": 2.0})
    with settings_scope(store):
        assert store.get_dp_config("e") == {"scope": "project", "epsilon": 2.0}
    # A dataset without any settings gets the defaults, as the single reads give them.
    with settings_scope(store):
        plain = settings_of(store, 1)
        assert plain is not None
        assert (plain.rules_path, plain.qss, plain.dp_config, plain.requirements) == (
            None,
            store.qss_settings("d"),
            None,
            {},
        )
    assert settings_of(store, 999) is None


def test_a_requests_first_read_of_a_sequence_brings_its_datasets_settings(store: Store) -> None:
    seq, _ = _open(store)
    claim_gate.require_claim(store, "d", "crosstab", "ethics")
    claim_gate.require_claim(store, "d", "regression", "ethics")
    # What the reads on their own give: the sequence and step, and the dataset's settings.
    plain_seq, plain_step = store.get_sequence_step(seq.id, 1)
    plain_settings = settings_of(store, seq.dataset_id)
    assert plain_seq is not None and plain_step is not None and plain_settings is not None
    sent = _statements(store)
    with settings_scope(store):
        got_seq, got_step = store.get_sequence_step(seq.id, 1)
        settings = settings_of(store, seq.dataset_id)
        versions = catalogue.version_ids(store, "d")
        # A later read in the same request (a waiting replica's) reads the rows alone.
        store.get_sequence_step(seq.id, 1)
    assert len(sent) == 2, sent
    assert got_seq is not None and got_step is not None
    assert (got_seq.id, got_seq.version, got_step.id, got_step.state) == (
        plain_seq.id,
        plain_seq.version,
        plain_step.id,
        plain_step.state,
    )
    assert settings == plain_settings
    assert versions == list(plain_settings.version_ids)
    # A step not revealed yet, and a sequence that does not exist, read as before.
    with settings_scope(store):
        assert store.get_sequence_step(seq.id, 2)[1] is None
        assert settings_of(store, seq.dataset_id) == plain_settings
    with settings_scope(store):
        assert store.get_sequence_step("f" * 32, 1) == (None, None)


def test_settle_of_a_step_begun_here_reads_neither_row(store: Store) -> None:
    seq, _ = _open(store)
    seq, _ = sequences.settle_step(store, seq.id, 1, StepOutcome(state=StepState.RELEASED), {})
    nxt = StepRow(index=2, trace_hash="t2", body=b"b2", body_hash="bh2", last=True)
    sequences.begin_step(
        store, seq.id, expected_version=seq.version, step=nxt, verifier_state={}, event_data={}
    )
    sent = _statements(store)
    seq, step = sequences.settle_step(store, seq.id, 2, StepOutcome(state=StepState.RELEASED), {})
    reads = [s for s in sent if s.lstrip().upper().startswith("SELECT") and "FROM sequences" in s]
    reads += [s for s in sent if s.lstrip().upper().startswith("SELECT") and "FROM steps" in s]
    assert reads == []
    # The returned rows are what a fresh read finds.
    stored_seq, stored_step = store.get_sequence(seq.id), store.get_step(seq.id, 2)
    assert stored_seq is not None and stored_step is not None
    assert (seq.state, seq.version, seq.current_index) == (
        stored_seq.state,
        stored_seq.version,
        stored_seq.current_index,
    )
    assert (step.id, step.state, step.log_index) == (
        stored_step.id,
        stored_step.state,
        stored_step.log_index,
    )


def test_settle_after_another_replica_settled_the_step_changes_nothing(store: Store) -> None:
    seq, _ = _open(store)
    seq, _ = sequences.settle_step(store, seq.id, 1, StepOutcome(state=StepState.RELEASED), {})
    nxt = StepRow(index=2, trace_hash="t2", body=b"b2", body_hash="bh2", last=False)
    sequences.begin_step(
        store, seq.id, expected_version=seq.version, step=nxt, verifier_state={}, event_data={}
    )
    # Another replica (its own Store on the same database) settles the step first.
    other = Store(store.engine.url.render_as_string(hide_password=False))
    try:
        sequences.settle_step(other, seq.id, 2, StepOutcome(state=StepState.WITHHELD), {})
    finally:
        other.close()
    events = _count_events(store)
    with pytest.raises(Conflict) as info:
        sequences.settle_step(store, seq.id, 2, StepOutcome(state=StepState.RELEASED), {})
    assert info.value.code == "concurrent_update"
    assert _count_events(store) == events
    assert store.get_step(seq.id, 2).state == "withheld"  # type: ignore[union-attr]
    assert store.get_sequence(seq.id).state == "aborted"  # type: ignore[union-attr]
