"""Helpers shared by the tests that run several API replicas (tests/server/test_replicas.py,
tests/cluster/, and the replica and queue tests beside them): a small people dataset with one
target for tracker attacks, a data directory on a shared database with one researcher, a
replica in a child process, and the review workspace's login by plain HTTP requests."""

from __future__ import annotations

import re
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.analyses import MagnitudeTable
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.server.config import DataDir, ServerConfig, initialise, scope_key
from safeaccess.server.datasets import register_dataset
from safeaccess.server.store import Store

PASSWORD = "correct horse battery staple"
N = 600
OCCUPATIONS = ["clerk", "nurse", "teacher", "driver"]
REGIONS = ["North", "South", "East", "West"]
TARGET = "age == 90"


def people(seed: int = 11) -> pd.DataFrame:
    """N people; one (the target) is 90, nobody else is over 79."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "person_id": np.arange(1001, 1001 + N, dtype=np.int64),
            "region": rng.choice(REGIONS, N),
            "sex": rng.choice(["F", "M"], N),
            "occupation": rng.choice(OCCUPATIONS, N),
            "age": rng.integers(18, 80, N),
            "income": np.round(rng.uniform(20_500, 59_500, N), 2),
        }
    )
    frame.loc[0, ["age", "region", "sex"]] = [90, "North", "M"]
    return frame


def people_metadata(name: str) -> DatasetMetadata:
    """The published metadata of `people()` registered as `name`."""
    return DatasetMetadata(
        name=name,
        record_key="person_id",
        columns=[
            Column(name="person_id", type="identifier"),
            Column(name="region", type="categorical", levels=REGIONS),
            Column(name="sex", type="categorical", levels=["F", "M"]),
            Column(name="occupation", type="categorical", levels=OCCUPATIONS),
            Column(name="age", type="integer", bounds=(18, 95)),
            Column(name="income", type="continuous", bounds=(0, 100_000)),
        ],
    )


def income(where: str | None) -> MagnitudeTable:
    """Total income by occupation among the people `where` selects (all if None)."""
    return MagnitudeTable(value="income", agg="sum", rows=["occupation"], where=where)


# The general tracker (q(C or T) + q(C or not T) - q(all) = q(C)) and an individual tracker
# (q(C1) - q(C1 and not C2)): one-step sequences by two researchers of project p1.
TRACKER = [
    ("ada", income(f"{TARGET} or sex == 'F'")),
    ("bob", income(f"{TARGET} or sex == 'M'")),
    ("ada", income(None)),
    ("bob", income("region == 'North'")),
    ("ada", income(f"region == 'North' and not ({TARGET})")),
]


def one_researcher_centre(
    root: Path,
    database_url: str,
    key: Ed25519PrivateKey,
    *,
    server_id: str,
    dataset: str,
    frame: pd.DataFrame,
    metadata: DatasetMetadata,
    execution: str = "local",
) -> ServerConfig:
    """A new data directory at `root` on `database_url`: project p1, researcher ada (`key`)
    and one dataset; `execution` as in config.yaml."""
    config = initialise(root, server_id=server_id, database_url=database_url)
    data = DataDir(root)
    if config.execution != execution:
        config = config.model_copy(update={"execution": execution})
        data.save_config(config)
    store = Store(database_url)
    try:
        store.add_project("p1")
        pub = key.public_key()
        store.add_researcher("ada", public_key_text(pub), fingerprint(pub), ["p1"])
        register_dataset(data, store, name=dataset, frame=frame, metadata=metadata, project="p1")
    finally:
        store.close()
    return config


def researcher_scope(database_url: str, dataset: str) -> str:
    """The query-set scope of ada's steps on `dataset` in project p1 (`one_researcher_centre`'s
    researcher and project), under the dataset's auditor settings."""
    store = Store(database_url)
    try:
        settings = store.qss_settings(dataset)
    finally:
        store.close()
    return scope_key(dataset, settings.scope, researcher="ada", project="p1")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(root: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """`safeaccess-server serve` on the data directory `root` in a child process on a loopback
    port, once it answers /v1/health; its standard error goes to `log`."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "safeaccess.server.admin.cli",
            "serve",
            "--data-dir",
            str(root),
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    deadline = time.monotonic() + 180  # generous: a loaded machine starts slowly
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
        if proc.poll() is not None:
            break
    proc.kill()
    proc.wait()
    raise RuntimeError(f"replica on port {port} did not start: {log.read_text()[-2000:]}")


COOKIE = "safeaccess_review"


def csrf(html: str) -> str:
    """The CSRF token of a review workspace form."""
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found is not None, html[:2000]
    return found.group(1)


def set_cookie(response: httpx.Response) -> str:
    """The review session cookie a response sets."""
    # The cookie is Secure, so httpx's jar would not send it back over plain HTTP: read it here.
    for header in response.headers.get_list("set-cookie"):
        found = re.match(rf"{COOKIE}=([^;]+)", header)
        if found:
            return found.group(1)
    raise AssertionError(f"no session cookie in {response.headers}")


Verify = bool | ssl.SSLContext


def review_get(base: str, path: str, cookie: str | None, verify: Verify = True) -> httpx.Response:
    """GET a review workspace page with the session cookie (if any)."""
    headers = {"Cookie": f"{COOKIE}={cookie}"} if cookie else {}
    return httpx.get(base + path, headers=headers, timeout=30, verify=verify)


def review_post(
    base: str, path: str, cookie: str, form: dict[str, str], verify: Verify = True
) -> httpx.Response:
    """POST a review workspace form with the session cookie."""
    headers = {"Cookie": f"{COOKIE}={cookie}"}
    return httpx.post(base + path, data=form, headers=headers, timeout=30, verify=verify)


def review_login(base: str, name: str, code: str, verify: Verify = True) -> str:
    """Log checker `name` in (password PASSWORD, TOTP `code`); her session cookie."""
    page = review_get(base, "/review/login", None, verify)
    anonymous = set_cookie(page)
    form = {"name": name, "password": PASSWORD, "code": code, "csrf_token": csrf(page.text)}
    answer = review_post(base, "/review/login", anonymous, form, verify)
    assert answer.status_code == 303 and answer.headers["location"] == "/review/", answer.text
    return set_cookie(answer)
