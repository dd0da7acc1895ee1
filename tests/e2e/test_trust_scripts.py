"""Issue 26, point 6: a script that raises is a failed step, never approvable, and nothing from
outside the sandbox's own view (the server's install path, its module frames) reaches an output."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import Centre, open_body, reveal_body, signed

from safeaccess.client.analyses import FrequencyTable, Script
from safeaccess.client.audit.checkpoint import parse_checkpoint
from safeaccess.client.audit.verify import ExportSource, verify_log
from safeaccess.server.auditors import AuditService
from safeaccess.server.errors import Conflict
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.review import decisions as review
from safeaccess.server.service import Service

SAFE = FrequencyTable(rows=["region"], cols=["sex"])


def test_a_crashing_script_is_failed_not_finished_and_cannot_be_approved(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = server
    crash = Script(code="print('partial', len(df))\nraise ValueError('boom')\n")
    sealed = centre.seal([crash, SAFE])
    response = signed(
        srv.url, centre.keys["ada"], "ada", "POST", "/v1/sequences", open_body(sealed)
    )
    assert response.status_code == 201, response.text
    view = response.json()
    assert service.scripts.wait_idle(120)
    recorded = service.store.get_step(view["sequence_id"], 1)
    assert recorded is not None
    assert recorded.error_code == "script_failed"
    assert recorded.output is None and recorded.public_output is None
    item = next(p for p in review.pending(service.store) if p.sequence_id == view["sequence_id"])
    assert item.run is not None and item.run.startswith("failed"), item.run
    with pytest.raises(Conflict, match="failed"):
        review.decide(service.store, view["sequence_id"], 1, approve=True, reviewer="carol")
    stored = service.store.get_step(view["sequence_id"], 1)
    assert stored is not None and stored.state == "review"
    # No trace of the server's installation (module paths, the runner's frames) anywhere.
    for text in (str(recorded.error_message), str(item.run)):
        assert "site-packages" not in text and "safeaccess" not in text and "/" not in text


def test_a_log_holding_a_failed_and_rejected_script_verifies(
    centre: Centre, server: tuple[Service, EmbeddedServer], tmp_path: Path
) -> None:
    service, srv = server
    sealed = centre.seal([Script(code="raise KeyError('x')\n"), SAFE])
    response = signed(
        srv.url, centre.keys["ada"], "ada", "POST", "/v1/sequences", open_body(sealed)
    )
    assert response.status_code == 201, response.text
    seq = response.json()["sequence_id"]
    assert service.scripts.wait_idle(120)
    assert review.decide(
        service.store, seq, 1, approve=False, reviewer="carol", note="the script failed"
    ) in ("aborted", "finished")
    export = tmp_path / "failed-script.export"
    export.write_bytes(b"".join(AuditService.of(service).export()))
    report = verify_log(ExportSource(export))
    assert report.kinds.get("script_run_finished", 0) >= 1
    assert report.kinds.get("review_rejected", 0) >= 1


# A script that runs about a second whatever the data, so its end comes after the reveal returns.
SLOW = Script(
    code="total = 0\nfor i in range(3_000_000):\n    total += i\nresult = {'n': len(df)}\n"
)


def _log_size(srv: EmbeddedServer, centre: Centre, sequence_id: str) -> int:
    """The log size a researcher reads from the signed checkpoint served with her step 1's proof."""
    path = f"/v1/sequences/{sequence_id}/steps/1/proof"
    response = signed(srv.url, centre.keys["ada"], "ada", "GET", path)
    assert response.status_code == 200, response.text
    checkpoint, _, _ = parse_checkpoint(response.json()["checkpoint"])
    return checkpoint.size


def test_the_log_does_not_tell_a_researcher_when_her_script_finished(
    centre: Centre, server: tuple[Service, EmbeddedServer], tmp_path: Path
) -> None:
    # The log grows by one entry when a script's run is recorded. Polling the checkpoint of
    # her own released step, a researcher read when her script ended on the real data: a
    # script that loops `income / 100` times told an income by its time.
    service, srv = server
    sealed = centre.seal([SAFE, SLOW])
    response = signed(
        srv.url, centre.keys["ada"], "ada", "POST", "/v1/sequences", open_body(sealed)
    )
    assert response.status_code == 201, response.text
    seq = response.json()["sequence_id"]
    reveal = signed(
        srv.url,
        centre.keys["ada"],
        "ada",
        "POST",
        f"/v1/sequences/{seq}/steps/2",
        reveal_body(sealed, 2),
    )
    assert reveal.status_code == 200, reveal.text
    before = _log_size(srv, centre, seq)
    assert service.scripts.wait_idle(120)
    ran = service.store.get_step(seq, 2)
    assert ran is not None and ran.output is not None  # the run is recorded for checkers
    assert _log_size(srv, centre, seq) == before
    # The run enters the log with the checker's decision, just before it: the log verifies.
    assert review.decide(service.store, seq, 2, approve=True, reviewer="carol") == "finished"
    export = tmp_path / "script-timing.export"
    export.write_bytes(b"".join(AuditService.of(service).export()))
    report = verify_log(ExportSource(export))
    assert report.kinds.get("script_run_finished", 0) >= 1
    kinds = [e.kind for e in service.store.events(seq) if e.step_index == 2]
    assert kinds[-2:] == ["script_run_finished", "review_approved"], kinds
