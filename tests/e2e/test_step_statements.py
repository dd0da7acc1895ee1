"""The SQL statements of a table step stay pinned (issue 25): a step's server CPU is mostly the
statements it sends, so a change that adds one fails here and has to say why.

Counts every statement the server's engine executes while one signed request is served over
HTTP (authentication included): the opening of a sequence with its step 1, then two reveals.
The pinned figures are what the step needs today (20-21 a reveal two passes of issue 25 ago,
17 before the last); see `store/sequences.py` for the two transactions that record it (a step is recorded
`running`, with its reveal's audit records, before its sandbox job starts, so that a crash
mid-job is seen, by the repeated reveal that runs it again and by auditors: two transactions,
not one)."""

from __future__ import annotations

from typing import Any

from e2e_helpers import Centre
from sqlalchemy import event

from safeaccess.client.analyses import FrequencyTable
from safeaccess.client.session import connect
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service

STEP = FrequencyTable(rows=["region"], cols=["sex"])

#: A reveal, 13 today: authentication (both failure limits and the claimed key in one read, the
#: nonce's upsert: 2; expired nonces are deleted at most once a minute); the sequence with the step and,
#: in the same statement, the dataset's settings (rule-set path, auditor settings, DP
#: configuration, claims, the ids of its versions: `store/step_settings.py`); the step's start,
#: one transaction (the sequence's guarded update returning its row, the step, the audit log's
#: reserve and its records, each with the Merkle nodes it completes: 4); the recording, one
#: transaction (the sequence's guarded update without a read first, the scope's pointer, the
#: audit log's 2, the step: 5); the view (withhold counts: 1). An append reads no stored nodes
#: (the process keeps the log's frontier from its own last append: `store/frontier.py`), and
#: on SQLite the admission reads no pointer (the process keeps the one it last recorded:
#: `qss/scope.py`). 17 before migration 0008, the kept pointer and the one authentication read.
MAX_REVEAL = 13
#: The opening of a sequence with its step 1 (its header's checks: the memberships, the
#: dataset; the first rule-set record of a fresh log; the sequence row, instead of the sequence's
#: and step's reads; the expired nonces' delete, the first in a minute): 19 today, and one read
#: of stored nodes when the log's last append was another process's (the centre's set-up).
MAX_OPEN = 20


def test_a_table_step_sends_a_pinned_number_of_statements(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = server
    sealed = centre.seal([STEP, STEP, STEP])
    executed: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        executed.append(statement)

    engine = service.store.engine
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        event.listen(engine, "before_cursor_execute", count)
        try:
            result = session.open(sealed)
            opening = len(executed)
            counts = []
            for j in (2, 3):
                executed.clear()
                assert result.released, result.describe()
                result = session.reveal(result.sequence_id, sealed, j)
                counts.append(len(executed))
        finally:
            event.remove(engine, "before_cursor_execute", count)
    assert result.released and result.last
    assert 0 < opening <= MAX_OPEN, opening
    assert all(0 < n <= MAX_REVEAL for n in counts), counts
