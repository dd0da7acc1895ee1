"""A step's times, as a researcher reads them, must not tell how long the centre worked on it.

How long a step runs depends on the data (a filter's selectivity, the query-set auditor's path).
The time a step view reports was its settle time, to the microsecond: the difference from the
moment she sent the reveal read that run time off without any network noise. The view, and the
log entry she fetches to check her receipt, now report the time of the last action someone took
on the step (her reveal, or a checker's decision).
"""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from e2e_helpers import Centre, WrappedBackend, open_body, reveal_body, serving, signed

from safeaccess.client.analyses import FrequencyTable
from safeaccess.sandbox.backend import Job, RunResult
from safeaccess.server.service import Service

SAFE = FrequencyTable(rows=["region"], cols=["sex"])
# Seconds the (simulated) data-dependent run takes on top of the real one. The check allows half
# of it between sending a request and the time its view reports: on a loaded CI machine an
# opening took 0.78 s to reach its step's record, over the 0.75 s that DELAY = 1.5 allowed.
DELAY = 3.0


class Slow(WrappedBackend):
    """The real sandbox, slower by DELAY on every job: a run whose length the data decides."""

    def run(self, job: Job) -> RunResult:
        time.sleep(DELAY)
        return self.real.run(job)


def _when(view: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(view["updated_at"]).astimezone(UTC)


def test_a_step_view_does_not_time_the_run(centre: Centre) -> None:
    probe = Service(centre.root)
    slow = Slow(probe.backend)
    probe.scripts.close()
    probe.store.close()
    with serving(centre.root, backend=slow) as (_, srv):
        sealed = centre.seal([SAFE, SAFE], researcher="ada")
        sent = datetime.now(UTC)
        opened = signed(
            srv.url, centre.keys["ada"], "ada", "POST", "/v1/sequences", open_body(sealed)
        )
        assert opened.status_code == 201, opened.text
        first = opened.json()
        assert first["state"] == "released", first
        seq = first["sequence_id"]
        sent_second = datetime.now(UTC)
        revealed = signed(
            srv.url,
            centre.keys["ada"],
            "ada",
            "POST",
            f"/v1/sequences/{seq}/steps/2",
            reveal_body(sealed, 2),
        )
        assert revealed.status_code == 200, revealed.text
        second = revealed.json()
        assert second["state"] == "released", second
        fetched = signed(srv.url, centre.keys["ada"], "ada", "GET", f"/v1/sequences/{seq}", b"")
        assert fetched.status_code == 200, fetched.text
        sequence = fetched.json()
        proof = signed(
            srv.url, centre.keys["ada"], "ada", "GET", f"/v1/sequences/{seq}/steps/2/proof"
        )
        assert proof.status_code == 200, proof.text
        record = json.loads(base64.b64decode(proof.json()["record"]))
    # Each step ran for more than DELAY; the time its view reports is the reveal's, so it lies
    # well within DELAY of the moment the researcher sent it (same machine, same clock).
    margin = timedelta(seconds=DELAY / 2)
    assert _when(first) - sent < margin, (first["updated_at"], sent)
    assert _when(second) - sent_second < margin, (second["updated_at"], sent_second)
    assert [_when(s) for s in sequence["steps"]] == [_when(first), _when(second)]
    # The log entry she fetches to check her receipt carries the same time, not the run's end.
    assert record["kind"] == "step_released", record
    assert datetime.fromisoformat(record["time"]) == _when(second), record
    # The sequence's own time says no more than its steps' do.
    assert datetime.fromisoformat(sequence["updated_at"]).astimezone(UTC) == _when(second)
