"""Helpers for the end-to-end tests: the test centre record, a centre built and served in one
call (`make_centre`, `set_dp`, `serving`), raw signed requests."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.analyses import Analysis, to_body
from safeaccess.client.httpsig import sign_request
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.protocol import SealedSequence, seal
from safeaccess.sandbox.backend import Backend, Job, RunResult
from safeaccess.server.admin.cli import main as admin
from safeaccess.server.config import DataDir, QssSettings, ServerConfig, initialise
from safeaccess.server.datasets import register_dataset
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store import Store

ROWS = 3000
SEED = 7


@dataclass
class Centre:
    root: Path
    server_id: str
    keys: dict[str, Ed25519PrivateKey]
    census: pd.DataFrame
    ca_key: Ed25519PrivateKey

    def seal(
        self,
        analyses: list[Analysis],
        *,
        researcher: str = "ada",
        dataset: str = "census",
        project: str = "p1",
        server: str | None = None,
    ) -> SealedSequence:
        return seal(
            [to_body(a) for a in analyses],
            self.keys[researcher],
            researcher=researcher,
            project=project,
            dataset=dataset,
            server=server or self.server_id,
        )


@dataclass(frozen=True)
class Dataset:
    """A dataset to register: its frame, metadata and project, and `register_dataset`'s other
    keywords (`options`: e.g. `qss`, `rules_file`)."""

    frame: pd.DataFrame
    metadata: DatasetMetadata
    project: str = "p1"
    options: Mapping[str, Any] = field(default_factory=dict)


def make_centre(
    root: Path,
    server_id: str,
    keys: Mapping[str, Ed25519PrivateKey],
    datasets: Mapping[str, Dataset | tuple[pd.DataFrame, DatasetMetadata]],
    *,
    projects: Mapping[str, Sequence[str]] | None = None,
) -> ServerConfig:
    """Initialise a centre in `root` with its researchers (`keys`, each in the projects
    `projects` names for her, else in "p1") and `datasets` registered in this order (a pair is
    a frame and its metadata in "p1"). Every project named is created."""
    config = initialise(root, server_id=server_id)
    data = DataDir(root)
    member = {name: list((projects or {}).get(name, ["p1"])) for name in keys}
    specs = {n: d if isinstance(d, Dataset) else Dataset(*d) for n, d in datasets.items()}
    named = {"p1", *(p for ps in member.values() for p in ps), *(d.project for d in specs.values())}
    store = Store(data.database_url(config))
    try:
        for project in sorted(named):
            store.add_project(project)
        for name, key in keys.items():
            pub = key.public_key()
            store.add_researcher(name, public_key_text(pub), fingerprint(pub), member[name])
        for name, d in specs.items():
            register_dataset(
                data,
                store,
                name=name,
                frame=d.frame,
                metadata=d.metadata,
                project=d.project,
                **d.options,
            )
    finally:
        store.close()
    return config


@contextmanager
def centre_store(root: Path) -> Iterator[Store]:
    """The store of the centre in `root` (what its admin reads and writes), closed after."""
    data = DataDir(root)
    store = Store(data.database_url(data.load_config()))
    try:
        yield store
    finally:
        store.close()


def add_dataset(root: Path, **register: Any) -> None:
    """Register a dataset in the centre in `root` (`register_dataset`'s keywords: `name`,
    `frame`, `metadata`, `project`, ...)."""
    with centre_store(root) as store:
        register_dataset(DataDir(root), store, **register)


def add_people(
    root: Path,
    name: str,
    frame: pd.DataFrame,
    columns: list[Column],
    qss: QssSettings | None = None,
) -> str:
    """Register `frame` as dataset `name` of project p1, its people named by `person_id` (the
    first of `columns`), audited under `qss` (None: the centre's default); returns the name. A
    test that needs a query-set scope of its own registers a dataset of its own."""
    metadata = DatasetMetadata(name=name, record_key="person_id", columns=columns)
    add_dataset(root, name=name, frame=frame, metadata=metadata, project="p1", qss=qss)
    return name


def set_dp(root: Path, dataset: str, epsilon: str, delta: str, *more: str) -> None:
    """The controller enables DP answers on `dataset` with this budget (the admin CLI's
    `dataset dp`; `more` are its further options)."""
    args = ["dataset", "dp", dataset, "--epsilon", epsilon, "--delta", delta, *more]
    assert admin([*args, "--data-dir", str(root)]) == 0


@contextmanager
def serving(root: Path, **options: Any) -> Iterator[tuple[Service, EmbeddedServer]]:
    """The centre in `root` served by the real API on a loopback port, until the block ends
    (`options` go to the `Service`, e.g. its sandbox `backend`)."""
    service = Service(root, **options)
    with service, EmbeddedServer(create_app(service)) as srv:
        yield service, srv


def signed(
    url: str, key: Ed25519PrivateKey, researcher: str, method: str, path: str, body: bytes = b""
) -> httpx.Response:
    """One raw signed request (for what the session would never send)."""
    headers = sign_request(method, path, "", body, key, researcher)
    headers["Content-Type"] = "application/json"
    return httpx.request(method, url + path, content=body, headers=headers, timeout=120)


def reveal_body(sealed: SealedSequence, j: int) -> bytes:
    trace, body = sealed.reveal_for(j)
    return json.dumps({"trace": trace.hex(), "body": base64.b64encode(body).decode()}).encode()


def open_body(sealed: SealedSequence) -> bytes:
    trace, body = sealed.reveal_for(1)
    return json.dumps(
        {
            "header": base64.b64encode(sealed.header).decode(),
            "signature": base64.b64encode(sealed.signature).decode(),
            "endorsements": [],
            "trace": trace.hex(),
            "body": base64.b64encode(body).decode(),
        }
    ).encode()


def open_body_with_endorsements(sealed: SealedSequence) -> bytes:
    data = json.loads(open_body(sealed))
    data["endorsements"] = [e.model_dump(mode="json") for e in sealed.endorsements]
    return json.dumps(data).encode()


def resigned_log(service: Any, path: Path, mutate: Callable[[list[dict[str, Any]]], None]) -> Any:
    """The centre's honest log after `mutate(records)`, renumbered, in a tree the centre's key
    signs again: what a dishonest centre could publish (an `ExportSource`). Only replaying the
    records can catch it."""
    from safeaccess.client.audit.checkpoint import Checkpoint, sign_checkpoint
    from safeaccess.client.audit.merkle import leaf_hash, root_of
    from safeaccess.client.audit.records import encode_record
    from safeaccess.client.audit.verify import ExportSource
    from safeaccess.server.auditors import AuditService

    path.write_bytes(b"".join(AuditService.of(service).export()))
    source = ExportSource(path)
    parsed = [json.loads(r) for _, r, _ in source.entries(0)]
    mutate(parsed)
    for i, p in enumerate(parsed):
        p["index"] = i
    records = [encode_record(p) for p in parsed]
    source.checkpoint_note = sign_checkpoint(
        Checkpoint(
            source.checkpoint_note.split("\n")[0],
            len(records),
            root_of([leaf_hash(r) for r in records]),
            int(time.time()),
        ),
        service.server_id,
        service.signing_key,
    )
    source.entries = lambda size: iter((i, r, None) for i, r in enumerate(records))
    return source


def serve_in_subprocess(
    root: Path, port: int, timeout: float = 180.0, stderr: Path | None = None
) -> subprocess.Popen[bytes]:
    """`safeaccess-server serve` in a child process (killable), once it answers /v1/health;
    its standard error goes to the file `stderr` if given."""
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
        stderr=subprocess.DEVNULL if stderr is None else stderr.open("wb"),
    )
    deadline = time.monotonic() + timeout  # generous: a loaded CI machine starts slowly
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise RuntimeError("server did not start")


def free_port() -> int:
    """A loopback port free right now (for a server started in a child process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HtmlCards(HTMLParser):
    """Collects the cards, the badges and the text of an HTML fragment; checks tags balance."""

    VOID = frozenset({"br", "hr", "img", "meta", "input", "col"})

    def __init__(self, markup: str) -> None:
        super().__init__()
        self.cards: list[str] = []
        self.badges: list[str] = []
        self.text: list[str] = []
        self.open: list[str] = []
        self.feed(markup)
        self.close()
        assert self.open == [], f"unclosed tags {self.open}"

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if "data-safeaccess" in found:
            self.cards.append(str(found["data-safeaccess"]))
        if "data-status" in found:
            self.badges.append(str(found["data-status"]))
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    @property
    def words(self) -> str:
        return " ".join(" ".join(self.text).split())


def unguard(monkeypatch: pytest.MonkeyPatch) -> None:
    """The centre before the auditor: every checked output is admitted, no state is kept (the
    attack suites run each attack so, to prove it extracts the value, and as deployed)."""
    from safeaccess.server.qss import admission
    from safeaccess.server.qss.gate import Gate

    monkeypatch.setattr(
        admission, "gate", lambda output, decision, **_: Gate(decision, {"admitted": True})
    )


def seed_synthesis(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Fix a synthetic-data step's randomness (the measurements' noise and the sampler's seed),
    so a calibration test releases the same data on every run."""
    import numpy as np

    from safeaccess.server.synth import measure, step
    from safeaccess.server.synth.protocol import WorkerRequest
    from safeaccess.server.synth.worker_client import WorkerResult

    rng = np.random.default_rng(seed)

    def noise(values: object, sigma: float) -> np.ndarray:
        x = np.asarray(values, dtype=np.float64)
        return x + rng.normal(0.0, sigma, x.shape)

    real_worker = step.run_worker

    def worker(request: WorkerRequest, *, timeout: float = 600.0) -> WorkerResult:
        return real_worker(request.model_copy(update={"seed": seed}), timeout=timeout)

    monkeypatch.setattr(measure, "gaussian_noise", noise)
    monkeypatch.setattr(step, "run_worker", worker)


class WrappedBackend:
    """A real sandbox backend behind a test's own `run` (a delay, an outage, a count): the rest
    of the backend protocol passes through."""

    def __init__(self, real: Backend):
        self.real = real
        self.name = real.name

    def check_available(self) -> None:
        self.real.check_available()

    def run(self, job: Job) -> RunResult:
        return self.real.run(job)

    def close(self) -> None:
        self.real.close()


def unique_person(census: pd.DataFrame) -> tuple[str, float]:
    """A filter selecting exactly one person of the census, and that person's income."""
    keys = ["region", "sex", "age", "ethnicity"]
    sizes = census.groupby(keys, observed=True).size()
    region, sex, age, ethnicity = sizes[sizes == 1].index[0]
    person = f"region = '{region}' and sex = '{sex}' and age = {age} and ethnicity = '{ethnicity}'"
    row = census[
        (census["region"] == region)
        & (census["sex"] == sex)
        & (census["age"] == age)
        & (census["ethnicity"] == ethnicity)
    ]
    return person, float(row["income"].iloc[0])
