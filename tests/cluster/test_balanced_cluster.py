"""docs/deploy.md's deployment, for real on loopback: HAProxy (TLS, round robin, health checks on
/v1/health) in front of two `safeaccess-server serve` replicas on one PostgreSQL and one data
directory; researchers, a checker and an auditor use the real clients over HTTPS.

- Several researchers' sequences, tracker attacks included, spread over both replicas: the same
  releases, refusals and outputs as one server on SQLite given the same sequences in the same
  order; the trackers are refused through the balancer.
- A checker logged in through one replica decides a step through the other.
- PostgreSQL restarted between steps: the next steps succeed, nothing is lost or recorded twice,
  every receipt verifies and the audit log verifies.
- A replica SIGKILLed between steps: HAProxy's health check takes it out, the client's next
  steps succeed on the other, receipts and the audit log verify; restarted, it is back in.
- A replica killed *during* a step: the client's retry on the other replica gets the result,
  and the step is released even if the client never asks again (with the job queue, a worker
  runs the step's job; replicas running steps themselves run again the steps of a replica whose
  sequence leases ended with it, `steps/orphans.py`).

Every test runs on both executions (the `balanced` fixture's parameter): "local" (each replica
runs its steps) and "queue" (two `safeaccess-server worker` hosts run them from PostgreSQL's job
queue).

The steps run one after the other: the order the query-set auditor sees is the test's.
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyotp
import pytest
from cluster_centre import Balanced, build_centre, seal_for
from cluster_support import HAPROXY_CONFIG, descendants, signal_all
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from sqlalchemy import select

from replica_helpers import (
    PASSWORD,
    TRACKER,
    csrf,
    review_get,
    review_post,
    set_cookie,
)
from safeaccess.client.analyses import (
    Analysis,
    FrequencyTable,
    MagnitudeTable,
    Summary,
)
from safeaccess.client.cli import main as client_main
from safeaccess.client.keys import load_public_key
from safeaccess.client.protocol import SealedSequence
from safeaccess.client.results import StepResult, verify_receipt
from safeaccess.client.session import Session, Unreachable, connect
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store.schema import StepRow
from safeaccess.server.web import accounts
from totp_codes import OneTimeCodes

pytestmark = pytest.mark.slow

UNSAFE = FrequencyTable(rows=["ethnicity"], cols=["region"])  # tiny cells: withheld
# (researcher, dataset, analyses), run in this order; a withheld step ends its sequence.
SEQUENCES: list[tuple[str, str, list[Analysis]]] = [
    (
        "ada",
        "census",
        [
            FrequencyTable(rows=["region"], cols=["sex"]),
            MagnitudeTable(value="income", rows=["region"]),
            Summary(variables=["age", "income"]),
            UNSAFE,
        ],
    ),
    (
        "bob",
        "census",
        [
            FrequencyTable(rows=["employment"]),
            MagnitudeTable(value="income", agg="mean", rows=["employment"]),
        ],
    ),
    ("carol", "census2", [FrequencyTable(rows=["sex"]), UNSAFE, FrequencyTable(rows=["region"])]),
    *[(researcher, "people", [analysis]) for researcher, analysis in TRACKER],
]

# One line of HAProxy's HTTP log: ... safeaccess_api/api1 ... "POST /v1/sequences HTTP/1.1"
SERVED = re.compile(r'safeaccess_api/(api\d) \S+ (\d{3}) .*"(\w+) (\S+) HTTP')


def served(cluster: Balanced, path: str | None = None) -> list[tuple[str, int, str, str]]:
    """(replica, status, method, path) of every request HAProxy passed on, in order. HAProxy
    writes a request's line once it is done, maybe just after the client had its answer: given
    `path`, wait (up to 10 s) until a request for it is in the log."""
    deadline = time.monotonic() + 10
    while True:
        text = cluster.haproxy.log.read_text(errors="replace")
        lines = [(m[1], int(m[2]), m[3], m[4]) for m in SERVED.finditer(text)]
        if path is None or any(p == path for *_, p in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def outcome(result: StepResult) -> tuple[object, ...]:
    """What a researcher learns from a step, minus what differs between two centres (ids,
    receipts)."""
    return (
        result.index,
        result.status,
        tuple(r.check for r in result.reasons),
        result.output,
        result.error_code,
    )


def run_all(
    sessions: dict[str, Session], server_id: str, keys: dict[str, Ed25519PrivateKey]
) -> list[list[StepResult]]:
    """Every sequence of SEQUENCES, in order, through `sessions` (one per researcher)."""
    runs = []
    for researcher, dataset, analyses in SEQUENCES:
        sealed = seal_for(keys, server_id, researcher, dataset, analyses)
        runs.append(list(sessions[researcher].run(sealed)))
    return runs


def check_receipts(
    cluster: Balanced, sealed_results: list[tuple[SealedSequence, StepResult]]
) -> None:
    """Every result's receipt verifies against the centre's key, read from its data directory
    (pinned: not the key a replica announces)."""
    key = load_public_key(cluster.root / "server_key.pem")
    assert isinstance(key, Ed25519PublicKey)
    for sealed, result in sealed_results:
        verify_receipt(result, key, sealed)


def audit_verifies(cluster: Balanced, capsys: pytest.CaptureFixture[str]) -> None:
    """`safeaccess audit verify` by the auditor, over HTTPS through HAProxy, key pinned."""
    args = [
        "audit",
        "verify",
        "--server",
        cluster.haproxy.url,
        "--key",
        str(cluster.key_file("eve")),
        "--auditor",
        "eve",
        "--ca-bundle",
        str(cluster.ca_file),
        "--server-key",
        str(cluster.root / "server_key.pem"),
    ]
    code = client_main(args)
    out = capsys.readouterr()
    assert code == 0, out.out + out.err


def step_events(cluster: Balanced, sequence_id: str) -> dict[int, Counter[str]]:
    """The audit log's entries of each step of a sequence, by kind."""
    store = cluster.store()
    try:
        events = store.events(sequence_id)
    finally:
        store.close()
    found: dict[int, Counter[str]] = {}
    for event in events:
        if event.step_index is not None:
            found.setdefault(event.step_index, Counter())[event.kind] += 1
    return found


# -- the same decisions as one host ---------------------------------------------------------------


def test_the_haproxy_configuration_is_valid(balanced: Balanced) -> None:
    checked = balanced.haproxy.check()
    assert checked.returncode == 0 and "Configuration file is valid" in checked.stdout, (
        checked.stdout + checked.stderr
    )
    # The production directory (00-global.cfg too) with deploy/haproxy/default-haproxy's values,
    # the certificate aside (the test's stands in for the centre's).
    deploy = HAPROXY_CONFIG.parent
    values = dict(
        line.split("=", 1)
        for line in (deploy / "default-haproxy").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert values["CONFIG"] == "/etc/haproxy/safeaccess.d"
    values["SAFEACCESS_TLS_CERT"] = balanced.haproxy.env["SAFEACCESS_TLS_CERT"]
    production = subprocess.run(
        ["haproxy", "-c", "-f", str(deploy)],
        env={**os.environ, **values},
        capture_output=True,
        text=True,
        check=False,
    )
    assert production.returncode == 0, production.stdout + production.stderr


def test_a_client_that_does_not_trust_the_centres_ca_is_refused(balanced: Balanced) -> None:
    session = connect(balanced.haproxy.url, balanced.keys["ada"], "ada")
    with session, pytest.raises(Unreachable, match="CERTIFICATE_VERIFY_FAILED"):
        session.health()


def test_sequences_spread_over_both_replicas_decide_as_one_host(
    balanced: Balanced, tmp_path: Path
) -> None:
    before = len(served(balanced))
    sessions = {r: balanced.session(r) for r in ("ada", "bob", "carol")}
    try:
        spread = run_all(sessions, balanced.server_id, balanced.keys)
    finally:
        for session in sessions.values():
            session.close()
    # The steps went to both replicas.
    steps = [s for s in served(balanced)[before:] if s[2] == "POST"]
    assert {replica for replica, *_ in steps} == {"api1", "api2"}, steps
    # One server on SQLite, the same centre, the same sequences in the same order.
    root = tmp_path / "one-host"
    config = build_centre(root, "one-host", None, balanced.keys)
    with Service(root) as service, EmbeddedServer(create_app(service)) as srv:
        alone = {r: connect(srv.url, balanced.keys[r], r) for r in ("ada", "bob", "carol")}
        try:
            single = run_all(alone, config.server_id, balanced.keys)
        finally:
            for session in alone.values():
                session.close()
    assert [[outcome(s) for s in run] for run in spread] == [
        [outcome(s) for s in run] for run in single
    ]
    # The sequences had releases and withholds, and the query-set auditor refused trackers
    # through the balancer (each tracker sequence is one step).
    statuses = [s.status for run in spread for s in run]
    assert "released" in statuses and "withheld" in statuses
    tracker = [run[0] for run in spread[-len(TRACKER) :]]
    assert any(s.released for s in tracker) and not all(s.released for s in tracker)
    # Researchers see one uniform reason; the centre's record names the query-set auditor.
    refused = [s for s in tracker if not s.released]
    store = balanced.store()
    try:
        rows = [store.get_step(s.sequence_id, 1) for s in refused]
    finally:
        store.close()
    for row in rows:
        assert row is not None and row.decision is not None
        withholds = [f["check"] for f in row.decision["findings"] if f["verdict"] == "withhold"]
        assert withholds == ["query_set"], row.decision


# -- a checker on both replicas ------------------------------------------------------------------


def test_a_checker_logged_in_through_one_replica_decides_through_the_other(
    balanced: Balanced,
) -> None:
    store = balanced.store()
    try:
        enrolment = accounts.add_checker(store, "olivia")
        found = accounts.enrolment_for(store, enrolment.token)
        assert found is not None
        codes = OneTimeCodes(pyotp.TOTP(found[1]))
        accounts.enrol(store, enrolment.token, PASSWORD, PASSWORD, codes.code())
    finally:
        store.close()
    sealed = balanced.seal("ada", "accounts", [MagnitudeTable(value="balance", rows=["region"])])
    with balanced.session("ada") as session:
        first = session.open(sealed)
    assert first.status == "review", first
    base = balanced.haproxy.url
    verify = ssl.create_default_context(cafile=str(balanced.ca_file))
    page = review_get(base, "/review/login", None, verify)
    form = {
        "name": "olivia",
        "password": PASSWORD,
        "code": codes.code(),
        "csrf_token": csrf(page.text),
    }
    login = review_post(base, "/review/login", set_cookie(page), form, verify)
    assert login.status_code == 303 and login.headers["location"] == "/review/", login.text
    cookie, login_replica = set_cookie(login), login.headers["x-safeaccess-replica"]
    # The step's page and the decision, each until answered by the other replica (round robin
    # alternates, so at most one extra request).
    path = f"/review/steps/{first.sequence_id}/1"
    for _ in range(4):
        page = review_get(base, path, cookie, verify)
        if page.headers["x-safeaccess-replica"] != login_replica:
            break
    assert page.status_code == 200 and page.headers["x-safeaccess-replica"] != login_replica
    token = csrf(page.text)
    # Let the next request go to the other replica again: one more page from the login one.
    for _ in range(4):
        if review_get(base, "/review/", cookie, verify).headers["x-safeaccess-replica"] == (
            login_replica
        ):
            break
    decided = review_post(
        base, path + "/decision", cookie, {"action": "approve", "csrf_token": token}, verify
    )
    assert decided.status_code == 303, decided.text
    assert decided.headers["x-safeaccess-replica"] != login_replica
    with balanced.session("ada") as session:
        released = session.step(first.sequence_id, 1)
    assert released.released and released.output is not None
    check_receipts(balanced, [(sealed, released)])
    store = balanced.store()
    try:
        kinds = [e.kind for e in store.events(first.sequence_id)]
    finally:
        store.close()
    assert "review_approved" in kinds


# -- failures between steps -----------------------------------------------------------------------


def test_a_postgresql_restart_between_steps_loses_and_doubles_nothing(
    balanced: Balanced, capsys: pytest.CaptureFixture[str]
) -> None:
    analyses: list[Analysis] = [FrequencyTable(rows=["region"], cols=["sex"])] * 4
    sealed = balanced.seal("bob", "census", analyses)
    with balanced.session("bob", retries=10) as session:
        results = [session.open(sealed)]
        for index in range(2, 5):
            if index in (2, 4):
                balanced.postgres.restart()  # every connection of both replicas is closed
            results.append(session.reveal(results[0].sequence_id, sealed, index))
    assert [r.status for r in results] == ["released"] * 4
    assert len({repr(r.output) for r in results}) == 1  # the same table each time
    check_receipts(balanced, [(sealed, r) for r in results])
    # Each step recorded once: one row each, and the same audit entries for every step.
    store = balanced.store()
    try:
        with store.transaction() as s:
            rows = list(
                s.scalars(select(StepRow).where(StepRow.sequence_id == results[0].sequence_id))
            )
    finally:
        store.close()
    assert sorted(r.index for r in rows) == [1, 2, 3, 4]
    per_step = step_events(balanced, results[0].sequence_id)
    assert sorted(per_step) == [1, 2, 3, 4]
    assert per_step[2] == per_step[3] == per_step[4], per_step
    assert all(count == 1 for count in per_step[3].values()), per_step[3]
    audit_verifies(balanced, capsys)


def test_a_replica_killed_between_steps_is_taken_out_and_the_other_serves(
    balanced: Balanced, capsys: pytest.CaptureFixture[str]
) -> None:
    analyses: list[Analysis] = [
        FrequencyTable(rows=["region"]),
        MagnitudeTable(value="income", rows=["sex"]),
        FrequencyTable(rows=["employment"]),
    ]
    sealed = balanced.seal("ada", "census", analyses)
    with balanced.session("ada") as session:
        results = [session.open(sealed)]
        balanced.kill_replica(1)  # SIGKILL by its PID
        took = balanced.haproxy.wait_for("api2", "DOWN", timeout=30)
        for index in (2, 3):
            results.append(session.reveal(results[0].sequence_id, sealed, index))
    assert [r.status for r in results] == ["released"] * 3
    # api2 stayed out: api1 answered both reveals.
    assert balanced.haproxy.states()["api2"].startswith("DOWN")
    last = f"/v1/sequences/{results[0].sequence_id}/steps/3"
    assert [(r, s) for r, s, _, p in served(balanced, last) if p == last] == [("api1", 200)]
    check_receipts(balanced, [(sealed, r) for r in results])
    audit_verifies(balanced, capsys)
    print(f"HAProxy marked the killed replica down after {took:.2f} s")
    # Restarted, the replica is taken back in.
    balanced.start_replica(1)
    balanced.haproxy.wait_for("api2", "UP", timeout=60)


@dataclass
class MidStep:
    """A sequence whose step 2 was running on replica api1 when api1 was SIGKILLed."""

    sealed: SealedSequence
    sequence_id: str
    first: StepResult
    answer: StepResult | None  # the client's reveal of step 2, if it got one
    error: BaseException | None  # else what it raised


def kill_mid_step(balanced: Balanced, researcher: str, *, through_haproxy: bool) -> MidStep:
    """Step 2 of a two-step sequence revealed while only api1 takes requests, its sandbox
    frozen (SIGSTOP on every process under api1), api1 SIGKILLed once the step is recorded as
    running, then api2 let back in. The client reveals through HAProxy (and retries), or
    straight to api1 (once: a client that sent its reveal and went away)."""
    haproxy = balanced.haproxy
    analyses: list[Analysis] = [FrequencyTable(rows=["region"]), FrequencyTable(rows=["sex"])]
    sealed = balanced.seal(researcher, "census", analyses)
    haproxy.runtime("disable server safeaccess_api/api2")  # everything to api1 for now
    got: list[StepResult] = []
    errors: list[BaseException] = []
    try:
        if through_haproxy:  # one session: it opened the sequence, then reveals
            session = balanced.session(researcher, retry_wait=0.5)
        else:
            direct = f"http://127.0.0.1:{balanced.ports[0]}"
            session = connect(direct, balanced.keys[researcher], researcher, retries=0)
        with session:
            first = session.open(sealed)  # on api1: it starts its sandbox templates for census
            if not first.released:
                raise RuntimeError(f"step 1 was not released: {first}")
            replica = balanced.replicas[0]
            if replica is None:
                raise RuntimeError("replica api1 is not running")
            # Step 2 hangs: in api1's sandbox, or (queue) in the queue while the workers are frozen.
            frozen = (
                balanced.worker_processes()
                if balanced.execution == "queue"
                else descendants(replica.pid)
            )
            signal_all(frozen, signal.SIGSTOP)

            def reveal() -> None:
                try:
                    got.append(session.reveal(first.sequence_id, sealed, 2))
                except BaseException as exc:  # reported to the test
                    errors.append(exc)

            waiting = threading.Thread(target=reveal)
            waiting.start()
            deadline = time.monotonic() + 60
            while step_state(balanced, first.sequence_id, 2) != "running":
                if time.monotonic() > deadline:
                    raise RuntimeError("step 2 was never recorded as running")
                time.sleep(0.02)
            balanced.kill_replica(0)  # mid-step, by its PID
            haproxy.runtime("enable server safeaccess_api/api2")
            if balanced.execution == "queue":
                signal_all(frozen, signal.SIGCONT)  # frozen for less than a lease
            waiting.join(timeout=120)
    finally:
        haproxy.runtime("enable server safeaccess_api/api2")
        if balanced.execution == "queue":
            signal_all(balanced.worker_processes(), signal.SIGCONT)
    return MidStep(
        sealed=sealed,
        sequence_id=first.sequence_id,
        first=first,
        answer=got[0] if got else None,
        error=errors[0] if errors else None,
    )


def step_state(balanced: Balanced, sequence_id: str, index: int) -> str | None:
    store = balanced.store()
    try:
        step = store.get_step(sequence_id, index)
        return None if step is None else str(step.state)
    finally:
        store.close()


def restart_api1(balanced: Balanced) -> None:
    if balanced.replicas[0] is None:
        balanced.start_replica(0)
    balanced.haproxy.wait_for("api1", "UP", timeout=60)


def test_the_clients_retry_after_its_replica_died_mid_step_gets_the_result(
    balanced: Balanced, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        killed = kill_mid_step(balanced, "ada", through_haproxy=True)
    finally:
        restart_api1(balanced)
    # The reveal in flight was sent again to api2 (by HAProxy on its reused connection, or by
    # the client after HAProxy's 502), which found the step running with nobody computing it
    # and ran it.
    assert killed.error is None, killed.error
    assert killed.answer is not None and killed.answer.status == "released"
    check_receipts(balanced, [(killed.sealed, killed.first), (killed.sealed, killed.answer)])
    path = f"/v1/sequences/{killed.sequence_id}/steps/2"
    answered = [(replica, status) for replica, status, _, p in served(balanced, path) if p == path]
    assert answered[-1] == ("api2", 200), answered
    # Recorded once: the step's audit entries are those of a step that ran once.
    per_step = step_events(balanced, killed.sequence_id)
    assert all(count == 1 for count in per_step[2].values()), per_step[2]
    audit_verifies(balanced, capsys)


def test_a_step_whose_replica_died_mid_step_is_rerun_without_the_client(
    balanced: Balanced,
) -> None:
    try:
        killed = kill_mid_step(balanced, "bob", through_haproxy=False)
        if not isinstance(killed.error, Unreachable):
            raise RuntimeError(f"expected the killed replica's lost connection: {killed.error!r}")
        # A researcher who only asks for the step's state (never re-sends the reveal).
        with balanced.session("bob") as session:
            later = session.wait(killed.sequence_id, 2, timeout=10, poll_interval=0.5)
    finally:
        restart_api1(balanced)
    assert later.status == "released", later


def test_the_replicas_logged_no_traceback(balanced: Balanced) -> None:
    for log in balanced.all_logs():
        text_ = log.read_text(errors="replace")
        assert "Traceback" not in text_, (log.name, text_[-3000:])
