"""The withhold budget is read on every step's view, so its statement must not grow with a
researcher's whole history nor depend on anyone else's: on SQLite it finds her aborted and open
sequences by index (migration 0007), and it still counts exactly the withholds and the open
sequences."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, insert

from safeaccess.server.states import TERMINAL_SEQUENCE_STATES, SequenceState
from safeaccess.server.store import Store, catalogue, review
from safeaccess.server.store.review import OPENING_REJECTED
from safeaccess.server.store.schema import SequenceRow, StepRow

NOW = datetime(2026, 11, 28, 12, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    s.add_project("p")
    for name in ("ada", "bob"):
        s.add_researcher(name, "PEM", f"fp-{name}", ["p"])
    for name in ("d", "e"):
        catalogue.add_dataset(
            s,
            name=name,
            version=1,
            project="p",
            path=f"{name}.parquet",
            sha256="0" * 64,
            rows=10,
            metadata={"name": name},
            rules_path=None,
        )
    yield s
    s.close()


def _sequence(store: Store, n: int, researcher: str, dataset_id: int, state: str) -> str:
    seq_id = f"{researcher[0]}{n:031d}"
    with store.engine.begin() as conn:
        conn.execute(
            insert(SequenceRow).values(
                id=seq_id,
                researcher=researcher,
                project="p",
                dataset_id=dataset_id,
                header=b"h",
                header_hash=f"{seq_id}{'0' * 32}",
                nonce=seq_id,
                signature=b"s",
                endorsements=[],
                state=state,
                current_index=1,
                verifier_state={},
                version=1,
                created_at=NOW,
                updated_at=NOW,
            )
        )
    return seq_id


def _step(
    store: Store, seq_id: str, state: str, at: datetime, error_code: str | None = None
) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            insert(StepRow).values(
                sequence_id=seq_id,
                index=1,
                trace_hash="t",
                body=b"b",
                body_hash="bh",
                last=True,
                state=state,
                error_code=error_code,
                created_at=at,
                updated_at=at,
            )
        )


def test_the_budget_counts_exactly_her_withholds_in_the_window_and_her_open_sequences(
    store: Store,
) -> None:
    # Rows as the flow leaves them: a withhold aborts its sequence in the same transaction.
    since = NOW - timedelta(days=30)
    n = 0
    expected_open = 0
    for state in SequenceState:  # one sequence of hers on d in every state
        n += 1
        seq = _sequence(store, n, "ada", 1, state.value)
        expected_open += state not in TERMINAL_SEQUENCE_STATES
        _step(store, seq, "withheld" if state == SequenceState.ABORTED else "released", NOW)
    for at in (NOW - timedelta(days=1), NOW - timedelta(days=29)):  # in the window: counted
        n += 1
        _step(store, _sequence(store, n, "ada", 1, "aborted"), "withheld", at)
    for state, at, code in (
        ("withheld", NOW - timedelta(days=31), None),  # before the window
        ("withheld", NOW - timedelta(days=2), OPENING_REJECTED),  # not a withhold of data
        ("failed", NOW - timedelta(days=2), None),  # aborted, not withheld
    ):
        n += 1
        _step(store, _sequence(store, n, "ada", 1, "aborted"), state, at, code)
    n += 1  # another dataset, and another researcher: neither counts
    _step(store, _sequence(store, n, "ada", 2, "aborted"), "withheld", NOW)
    n += 1
    _step(store, _sequence(store, n, "bob", 1, "aborted"), "withheld", NOW)
    assert review.withholds_since(store, "ada", "d", since) == (3, expected_open)
    assert expected_open == len(SequenceState) - 2


def test_the_budget_is_read_by_index_not_by_her_history(store: Store) -> None:
    # The statement and parameters exactly as the driver receives them.
    sent: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        sent.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", capture)
    try:
        review.withholds_since(store, "ada", "d", NOW - timedelta(days=30))
    finally:
        event.remove(store.engine, "before_cursor_execute", capture)
    (statement, parameters), *_ = [s for s in sent if "count(*)" in s[0]]
    with store.engine.connect() as conn:
        plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).fetchall()
    details = [str(row[-1]) for row in plan]
    # Both counts start from her sequences by (researcher, state): her aborted ones for the
    # withholds, her open ones for the rest. Nothing scans the steps of every researcher, so
    # the read's time tells her nothing about anyone else's withholds.
    by_state = [
        d for d in details if "ix_sequences_researcher_state (researcher=? AND state=?)" in d
    ]
    assert len(by_state) == 2, details
    assert not any(d.startswith("SCAN steps") for d in details), details
    assert any("steps USING INDEX ix_steps_sequence_id (sequence_id=?)" in d for d in details), (
        details
    )
