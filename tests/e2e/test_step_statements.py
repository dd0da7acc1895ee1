"""The SQL statements of a table step stay pinned (issue 25): a step's server CPU is mostly the
statements it sends, so a change that adds one fails here and has to say why.

Counts every statement the server's engine executes while one signed request is served over
HTTP (authentication included): the opening of a sequence with its step 1, then two reveals.
The pinned figures are what the step needs today; see `store/sequences.py` for the two
transactions that record it (a step is recorded `running` before its sandbox job starts, so
that a crash mid-job is seen and the step runs again: two transactions, not one)."""

from __future__ import annotations

from typing import Any

from e2e_helpers import Centre
from sqlalchemy import event

from safeaccess.client.analyses import FrequencyTable
from safeaccess.client.session import connect
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service

STEP = FrequencyTable(rows=["region"], cols=["sex"])

#: A reveal, 20 today: authentication (both failure limits in one read, the key, the nonce's
#: upsert: 3; expired nonces are deleted at most once a minute); the sequence with the step (one
#: statement) and the dataset's settings (rule-set path, auditor settings, DP configuration,
#: claims: one statement for the whole request, `store/step_settings.py`); the step's start, one
#: transaction (the sequence's guarded update returning its row, the step, the audit log's
#: reserve, records and nodes: 5); the scope's pointer and the dataset's versions (2); the
#: recording, one transaction (the sequence's guarded update without a read first, the pointer,
#: the audit log's 3, the step: 6); the view (withhold counts: 1). Each of the two appends to the
#: audit log also reads stored nodes (one statement) when its new leaves complete a stored
#: subtree: up to 2 more.
MAX_REVEAL = 22
#: The opening of a sequence with its step 1 (its header's checks: the memberships, the
#: dataset; the first rule-set record of a fresh log; the sequence row, instead of the sequence's
#: and step's reads; the expired nonces' delete, the first in a minute): 24 today.
MAX_OPEN = 26


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
