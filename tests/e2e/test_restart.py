"""Crash safety: a server killed mid-step resumes the sequence after a restart, re-running the
unrecorded step once and never losing recorded results."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from e2e_helpers import Centre, WrappedBackend, centre_store, free_port, serve_in_subprocess
from sqlalchemy import select

from safeaccess.client.analyses import FrequencyTable, Regression
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.sandbox.backend import Backend, Job, RunResult, SandboxError
from safeaccess.server.errors import Unavailable
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.schemas import RevealRequest
from safeaccess.server.service import Service
from safeaccess.server.store import Store
from safeaccess.server.store.schema import EventRow

A = FrequencyTable(rows=["region"])
# Step 2, the one killed mid-run: a fit with a real admission, not a standard table (a standard
# table is reserved, so asking it is a repeat decided in a few milliseconds, and the step could
# be recorded between the test's seeing it run and its kill).
B = Regression(formula="income ~ age + C(sex)")
C = FrequencyTable(rows=["employment"])


def _state_in(store: Store, index: int) -> str | None:
    seqs = store.list_sequences("ada")
    if not seqs:
        return None
    step = store.get_step(seqs[-1].id, index)
    return step.state if step else None


def _step_state(service_root: Path, index: int) -> str | None:
    with centre_store(service_root) as store:
        return _state_in(store, index)


@pytest.mark.slow
def test_server_killed_mid_step_resumes_after_restart(centre: Centre) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sealed = centre.seal([A, B, C])
    proc = serve_in_subprocess(centre.root, port)
    results: list[StepResult] = []
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            # Retries wait 0.5, 1, 1.5 ... s: about 40 s in all, for a restart on a loaded machine.
            with connect(url, centre.keys["ada"], "ada", retries=12, retry_wait=0.5) as s:
                results.extend(s.run(sealed))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    try:
        driver = threading.Thread(target=drive)
        driver.start()
        # Kill the server (SIGKILL: no cleanup) once step 2 is accepted but not yet recorded.
        # (one store for the polling: opening one per poll took longer than a step's run)
        deadline = time.monotonic() + 60
        with centre_store(centre.root) as store:
            while _state_in(store, 2) != "running":
                assert time.monotonic() < deadline, "step 2 never started"
                time.sleep(0.005)
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert _step_state(centre.root, 2) == "running"
        proc = serve_in_subprocess(centre.root, port)
        driver.join(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert not errors, errors
    assert [r.status for r in results] == ["released", "released", "released"]
    assert [r.index for r in results] == [1, 2, 3]
    service = Service(centre.root)
    try:
        seq_id = results[0].sequence_id
        with service.store.transaction() as s:
            kinds = [
                (e.kind, e.step_index)
                for e in s.scalars(select(EventRow).where(EventRow.sequence_id == seq_id))
            ]
        # Step 2 was revealed once and recorded once, although it ran twice.
        assert kinds.count(("step_revealed", 2)) == 1
        assert kinds.count(("step_released", 2)) == 1
        assert service.step("ada", seq_id, 1).output == results[0].output
        # The log written across the kill verifies: sequence replay included.
        from safeaccess.client.audit.verify import ExportSource, verify_log

        export = centre.root / "after-restart.export"
        export.write_bytes(b"".join(service.audit.export()))
        report = verify_log(ExportSource(export))
        assert report.sequences >= 1 and report.steps_released >= 3
    finally:
        service.close()


class FlakySandbox(WrappedBackend):
    """The real backend, except that chosen calls fail as if the sandbox host went away."""

    def __init__(self, real: Backend, fail_calls: set[int]):
        super().__init__(real)
        self.calls = 0
        self.fail_calls = fail_calls

    def run(self, job: Job) -> RunResult:
        self.calls += 1
        if self.calls in self.fail_calls:
            raise SandboxError("the sandbox host went away")
        return self.real.run(job)


def test_sandbox_outage_leaves_the_step_rerunnable(centre: Centre) -> None:
    real = Service(centre.root)
    flaky = FlakySandbox(real.backend, fail_calls={2})
    service = Service(centre.root, backend=flaky)
    sealed = centre.seal([A, B])
    try:
        with (
            EmbeddedServer(create_app(service)) as srv,
            connect(srv.url, centre.keys["ada"], "ada", retries=0) as session,
        ):
            first = session.open(sealed)
            trace, body = sealed.reveal_for(2)
            with pytest.raises(Unavailable):
                service.flow.reveal(
                    "ada",
                    first.sequence_id,
                    2,
                    RevealRequest(
                        trace=trace.hex(), body=__import__("base64").b64encode(body).decode()
                    ),
                )
            assert service.store.get_step(first.sequence_id, 2).state == "running"  # type: ignore[union-attr]
            again = session.reveal(first.sequence_id, sealed, 2)
            assert again.released and again.last
            assert session.sequence(first.sequence_id)["state"] == "finished"
            # A repeated reveal answers again without running the step a third time.
            calls = flaky.calls
            assert session.reveal(first.sequence_id, sealed, 2).output == again.output
            assert flaky.calls == calls
    finally:
        service.close()
        real.store.close()
