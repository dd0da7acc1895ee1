"""Two API replicas on one PostgreSQL database: two real `safeaccess-server serve` processes on
loopback ports, one data directory, the process sandbox.

What one replica learns, the other knows at once: a checker's session (only its cookie's hash is
in the database), her logout and her account being disabled; authentication failures (the 429
comes from either); request nonces; the withhold budget; the DP ledger. The query-set auditor's
admissions in one scope wait for each other across replicas (the scope's advisory lock) and give
the decisions of a serial run in their commit order, without admitting anything twice; an
admission in another scope is not blocked while the lock is held.
"""

from __future__ import annotations

import hashlib
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pyotp
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import MetaData, create_engine, func, make_url, select, text

from pg_throwaway import free_port
from replica_helpers import (
    PASSWORD,
    TRACKER,
    csrf,
    income,
    people,
    people_metadata,
    review_get,
    review_login,
    review_post,
    serve,
    set_cookie,
)
from safeaccess.client.analyses import Analysis, DPCount, FrequencyTable, to_body
from safeaccess.client.httpsig import sign_request
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.protocol import SealedSequence, seal
from safeaccess.client.results import StepResult
from safeaccess.client.session import Session, connect
from safeaccess.server.admin.cli import main as server_cli
from safeaccess.server.config import DataDir, initialise, scope_key
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.qss.scope import LOCK_KIND
from safeaccess.server.ratelimit import PER_KEY
from safeaccess.server.service import Service
from safeaccess.server.store import Store
from safeaccess.server.store.advisory_locks import advisory_key
from safeaccess.server.store.schema import StepRow
from safeaccess.server.web import accounts
from totp_codes import OneTimeCodes

pytestmark = pytest.mark.slow


@dataclass
class Cluster:
    root: Path
    url: str  # the database
    server_id: str
    keys: dict[str, Ed25519PrivateKey]
    replicas: list[str]  # base URLs
    logs: list[Path]
    codes: OneTimeCodes | None = None

    def seal(self, analyses: list[Analysis], *, researcher: str, dataset: str) -> SealedSequence:
        project = "p2" if researcher == "carol" else "p1"
        return seal(
            [to_body(a) for a in analyses],
            self.keys[researcher],
            researcher=researcher,
            project=project,
            dataset=dataset,
            server=self.server_id,
        )

    def session(self, replica: int, researcher: str) -> Session:
        return connect(self.replicas[replica], self.keys[researcher], researcher)

    def store(self) -> Store:
        return Store(self.url)

    def code(self) -> str:
        """A TOTP code of the enrolled checker not used yet."""
        assert self.codes is not None
        return self.codes.code()


@pytest.fixture(scope="module")
def cluster(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    name = f"replicas_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(postgres_url).set(database=name).render_as_string(False)
    base = tmp_path_factory.mktemp("replicas")
    root = base / "data"
    config = initialise(root, server_id="replicated", database_url=url)
    data = DataDir(root)
    keys = {r: Ed25519PrivateKey.generate() for r in ("ada", "bob", "carol")}
    store = Store(url)
    try:
        store.add_project("p1")
        store.add_project("p2")
        for r, projects in (("ada", ["p1"]), ("bob", ["p1"]), ("carol", ["p2"])):
            pub = keys[r].public_key()
            store.add_researcher(r, public_key_text(pub), fingerprint(pub), projects)
        for dataset, project in (("people", "p1"), ("people2", "p2")):
            register_dataset(
                data,
                store,
                name=dataset,
                frame=people(),
                metadata=people_metadata(dataset),
                project=project,
            )
        census = generate_census(2000, seed=11)
        rules = base / "budget.yaml"
        rules.write_text("withhold_budget: {count: 2, days: 30}\n")
        register_dataset(
            data,
            store,
            name="budgeted",
            frame=census,
            metadata=census_metadata("budgeted"),
            project="p1",
            rules_file=rules,
        )
        register_dataset(
            data,
            store,
            name="dpdata",
            frame=census,
            metadata=census_metadata("dpdata"),
            project="p1",
        )
    finally:
        store.close()
    d = ["--data-dir", str(root)]
    assert server_cli(["dataset", "dp", "dpdata", "--epsilon", "1", "--delta", "1e-5", *d]) == 0
    ports = [free_port(), free_port()]
    logs = [base / f"replica{i}.log" for i in range(2)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for port, log in zip(ports, logs, strict=True):
            procs.append(serve(root, port, log))
        yield Cluster(
            root=root,
            url=url,
            server_id=config.server_id,
            keys=keys,
            replicas=[f"http://127.0.0.1:{p}" for p in ports],
            logs=logs,
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# -- the review workspace's sessions ------------------------------------------------------------


def _get(base: str, path: str, cookie: str | None) -> httpx.Response:
    return review_get(base, path, cookie)


def _post(base: str, path: str, cookie: str, form: dict[str, str]) -> httpx.Response:
    return review_post(base, path, cookie, form)


def _login(cluster: Cluster, replica: int, name: str) -> str:
    return review_login(cluster.replicas[replica], name, cluster.code())


def _logged_in(response: httpx.Response) -> bool:
    if response.status_code == 303:
        assert response.headers["location"].startswith("/review/login")
        return False
    assert response.status_code == 200
    return True


def _table_text(cluster: Cluster, table: str) -> str:
    engine = create_engine(cluster.url)
    try:
        meta = MetaData()
        meta.reflect(engine, only=[table])
        with engine.connect() as connection:
            return repr([tuple(r) for r in connection.execute(select(meta.tables[table]))])
    finally:
        engine.dispose()


def test_a_checker_logs_in_on_one_replica_and_works_on_the_other(cluster: Cluster) -> None:
    store = cluster.store()
    try:
        enrolment = accounts.add_checker(store, "olivia")
        found = accounts.enrolment_for(store, enrolment.token)
        assert found is not None
        cluster.codes = OneTimeCodes(pyotp.TOTP(found[1]))
        accounts.enrol(store, enrolment.token, PASSWORD, PASSWORD, cluster.code())
    finally:
        store.close()
    cookie = _login(cluster, 0, "olivia")
    queue = _get(cluster.replicas[1], "/review/", cookie)  # the other replica knows her
    assert _logged_in(queue) and "olivia" in queue.text
    # Only the SHA-256 of the cookie is in the database; the cookie itself is nowhere.
    stored = _table_text(cluster, "web_sessions")
    assert hashlib.sha256(cookie.encode()).hexdigest() in stored and cookie not in stored
    # A form served by one replica is accepted by the other (the CSRF token is the session's).
    token = csrf(_get(cluster.replicas[0], "/review/", cookie).text)
    bye = _post(cluster.replicas[1], "/review/logout", cookie, {"csrf_token": token})
    assert bye.status_code == 303
    assert not _logged_in(_get(cluster.replicas[0], "/review/", cookie))
    assert hashlib.sha256(cookie.encode()).hexdigest() not in _table_text(cluster, "web_sessions")


def test_disabling_a_checker_logs_her_out_on_every_replica(cluster: Cluster) -> None:
    if cluster.codes is None:
        pytest.skip("needs the enrolment of the test before")
    cookies = [_login(cluster, 0, "olivia"), _login(cluster, 1, "olivia")]
    assert all(_logged_in(_get(base, "/review/", c)) for base in cluster.replicas for c in cookies)
    assert server_cli(["checker", "disable", "olivia", "--data-dir", str(cluster.root)]) == 0
    assert not any(_logged_in(_get(b, "/review/", c)) for b in cluster.replicas for c in cookies)
    assert "olivia" not in _table_text(cluster, "web_sessions")  # her rows went with her account


def test_login_failures_on_one_replica_count_on_the_other(cluster: Cluster) -> None:
    page = _get(cluster.replicas[0], "/review/login", None)
    cookie, token = set_cookie(page), csrf(page.text)
    form = {"name": "nobody", "password": "wrong password!", "code": "123456", "csrf_token": token}
    limit = 5  # ReviewWebConfig.login_failures_per_account's default
    for i in range(limit):
        assert _post(cluster.replicas[i % 2], "/review/login", cookie, form).status_code == 401
    for base in cluster.replicas:
        refused = _post(base, "/review/login", cookie, form)
        assert refused.status_code == 429 and "Try again in" in refused.text


# -- signed requests: failures and nonces ---------------------------------------------------------


def _signed(base: str, key: Ed25519PrivateKey, keyid: str, path: str) -> httpx.Response:
    headers = sign_request("GET", path, "", b"", key, keyid)
    return httpx.get(base + path, headers=headers, timeout=30)


def test_authentication_failures_on_either_replica_reach_the_limit_on_both(
    cluster: Cluster,
) -> None:
    forger = Ed25519PrivateKey.generate()
    for i in range(PER_KEY.failures):  # alternately: half the limit on each replica
        answer = _signed(cluster.replicas[i % 2], forger, "mallory", "/v1/sequences")
        assert answer.status_code == 401
    for base in cluster.replicas:
        refused = _signed(base, forger, "mallory", "/v1/sequences")
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
    # per key id: ada, from the same address, is not refused
    assert (
        _signed(cluster.replicas[1], cluster.keys["ada"], "ada", "/v1/sequences").status_code == 200
    )
    stored = _table_text(cluster, "auth_failures")
    assert "mallory" not in stored and "127.0.0.1" not in stored  # subjects are hashed


def test_a_nonce_used_on_one_replica_is_refused_on_the_other(cluster: Cluster) -> None:
    headers = sign_request("GET", "/v1/sequences", "", b"", cluster.keys["bob"], "bob")
    first = httpx.get(cluster.replicas[0] + "/v1/sequences", headers=headers, timeout=30)
    replay = httpx.get(cluster.replicas[1] + "/v1/sequences", headers=headers, timeout=30)
    assert (first.status_code, replay.status_code) == (200, 401)


# -- the withhold budget and the DP ledger, steps alternating between replicas ------------------


def test_the_withhold_budget_counts_withholds_from_both_replicas(cluster: Cluster) -> None:
    unsafe = FrequencyTable(rows=["ethnicity"], cols=["region"])
    safe = FrequencyTable(rows=["region"], cols=["sex"])
    results = []
    for i in range(2):
        with cluster.session(i, "bob") as session:
            results.append(
                session.open(cluster.seal([unsafe], researcher="bob", dataset="budgeted"))
            )
    assert [r.withheld for r in results] == [True, True]
    assert [r.withhold_budget.used for r in results if r.withhold_budget] == [1, 2]
    for i in range(2):  # the budget is spent on both replicas
        with cluster.session(i, "bob") as session:
            held = session.open(cluster.seal([safe], researcher="bob", dataset="budgeted"))
        assert held.status == "pending" and held.awaiting_approval
        assert [r.check for r in held.reasons] == ["withhold_budget"]


def test_the_dp_ledger_is_exact_when_steps_alternate_between_replicas(cluster: Cluster) -> None:
    # (1, 1e-5) is a budget of 1 / 3.7306316348**2 = 0.0718 in sum (Delta/sigma)^2; a count with
    # sigma 10 spends 0.01, so seven fit and the eighth does not.
    sealed = cluster.seal([DPCount(sigma=10.0)] * 8, researcher="ada", dataset="dpdata")
    with cluster.session(0, "ada") as a, cluster.session(1, "ada") as b:
        steps: list[StepResult] = [a.open(sealed)]
        sequence_id = steps[0].sequence_id
        for index in range(2, 9):
            steps.append((a, b)[index % 2].reveal(sequence_id, sealed, index))
    assert [s.released for s in steps] == [True] * 7 + [False]
    assert [r.check for r in steps[7].reasons] == ["dp_budget"]
    store = cluster.store()
    try:
        ledger = store.dp_ledger("dpdata|researcher|ada")
    finally:
        store.close()
    assert ledger is not None and ledger.releases == 7
    assert ledger.spent == pytest.approx(7 * (1 / 10.0) ** 2, rel=1e-9)


# -- the query-set auditor's scope lock ---------------------------------------------------------


def _waiting(cluster: Cluster, key: int) -> int:
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    engine = create_engine(cluster.url)
    try:
        with engine.connect() as connection:
            return int(
                connection.execute(
                    text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT "
                        "granted AND classid::bigint = :hi AND objid::bigint = :lo"
                    ),
                    {"hi": unsigned >> 32, "lo": unsigned & 0xFFFF_FFFF},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def _serially(order: list[tuple[str, Analysis]], tmp: Path) -> list[bool]:
    """Whether each query is released when run one after the other, in this order, by one
    server on a fresh SQLite centre with the same data."""
    root = tmp / "serial"
    config = initialise(root, server_id="serial")
    data = DataDir(root)
    keys = {r: Ed25519PrivateKey.generate() for r in ("ada", "bob")}
    store = Store(data.database_url(config))
    try:
        store.add_project("p1")
        for r, key in keys.items():
            pub = key.public_key()
            store.add_researcher(r, public_key_text(pub), fingerprint(pub), ["p1"])
        register_dataset(
            data,
            store,
            name="people",
            frame=people(),
            metadata=people_metadata("people"),
            project="p1",
        )
    finally:
        store.close()
    released = []
    with Service(root) as service, EmbeddedServer(create_app(service)) as srv:
        for researcher, analysis in order:
            sealed = seal(
                [to_body(analysis)],
                keys[researcher],
                researcher=researcher,
                project="p1",
                dataset="people",
                server="serial",
            )
            with connect(srv.url, keys[researcher], researcher) as session:
                released.append(session.open(sealed).released)
    return released


def test_admissions_in_one_scope_wait_across_replicas_and_other_scopes_do_not(
    cluster: Cluster, tmp_path: Path
) -> None:
    scope = scope_key("people", "project", researcher="ada", project="p1")
    key = advisory_key(LOCK_KIND, scope)
    holder = create_engine(cluster.url).connect()
    holder.execute(select(func.pg_advisory_lock(key)))  # as if an admission were under way
    results: dict[int, StepResult] = {}
    errors: list[BaseException] = []

    def run(i: int, researcher: str, analysis: Analysis) -> None:
        try:
            with cluster.session(i % 2, researcher) as session:
                results[i] = session.open(
                    cluster.seal([analysis], researcher=researcher, dataset="people")
                )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, r, a)) for i, (r, a) in enumerate(TRACKER)]
    try:
        for thread in threads:
            thread.start()
        # Each replica's first admission waits in the database (the others wait behind it in
        # their process).
        deadline = time.monotonic() + 300
        while _waiting(cluster, key) < 2:
            assert time.monotonic() < deadline and not errors, errors
            time.sleep(0.2)
        # Another scope (project p2) is not blocked, on either replica.
        for i in range(2):
            started = time.monotonic()
            with cluster.session(i, "carol") as session:
                other = session.open(
                    cluster.seal([income(None)], researcher="carol", dataset="people2")
                )
            assert other.released and time.monotonic() - started < 60
        assert results == {} and _waiting(cluster, key) == 2  # p1 still waits
    finally:
        holder.execute(select(func.pg_advisory_unlock(key)))
        holder.close()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert sorted(results) == list(range(len(TRACKER)))
    # The decisions are those of a serial run in the order the steps were recorded.
    store = cluster.store()
    try:
        with store.transaction() as s:
            log_index = {
                r.sequence_id: r.log_index
                for r in s.scalars(select(StepRow).where(StepRow.index == 1))
            }
        pointer = store.qss_pointer(scope)
    finally:
        store.close()
    order = sorted(results, key=lambda i: log_index[results[i].sequence_id])
    serial = _serially([TRACKER[i] for i in order], tmp_path)
    assert [results[i].released for i in order] == serial
    assert not all(serial)  # the trackers were caught: the order mattered
    # Every released step was admitted once: none was admitted again against a moved state.
    # The scope's first step also decides its population and standard tables, and keeps them
    # in a state of its own when its output is withheld.
    assert pointer is not None and pointer.admitted == sum(serial) + (0 if serial[0] else 1)
    for log in cluster.logs:
        assert "admitting again" not in log.read_text()


def test_replicas_logged_no_error(cluster: Cluster) -> None:
    for log in cluster.logs:
        text_ = log.read_text()
        assert "Traceback" not in text_, text_[-3000:]
