"""The centre the cluster tests run: `build_centre` makes the same projects, researchers,
auditor and datasets on any database (so a test can compare the cluster with one server on
SQLite), and `Balanced` is the running cluster of tests/cluster/conftest.py."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from cluster_support import HAProxy, descendants, signal_all
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pg_throwaway import ThrowawayPostgres
from replica_helpers import REGIONS, people, people_metadata, serve
from safeaccess.client.analyses import Analysis, to_body
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.protocol import SealedSequence, seal
from safeaccess.client.session import Session, connect
from safeaccess.server.config import DataDir, ServerConfig, initialise
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.store import Store

RESEARCHERS = {"ada": "p1", "bob": "p1", "carol": "p2"}
AUDITOR = "eve"
CENSUS_ROWS = 2000
LEDGER_ROWS = 200


def accounts() -> tuple[pd.DataFrame, DatasetMetadata]:
    """Account balances, positive except three in the West: a total by region goes to a checker
    (the default rules send a magnitude table with negative contributions to review)."""
    rng = np.random.default_rng(5)
    region = np.array([REGIONS[i % 4] for i in range(LEDGER_ROWS)])
    balance = np.exp(rng.normal(7.0, 0.4, LEDGER_ROWS)).round(0)
    balance[np.flatnonzero(region == "West")[:3]] = -50.0
    frame = pd.DataFrame(
        {
            "account": np.arange(1, LEDGER_ROWS + 1, dtype=np.int64),
            "region": pd.Categorical(region, categories=REGIONS),
            "balance": balance,
        }
    )
    metadata = DatasetMetadata(
        name="accounts",
        record_key="account",
        columns=[
            Column(name="account", type="identifier"),
            Column(name="region", type="categorical", levels=list(REGIONS)),
            Column(name="balance", type="continuous", bounds=(-100_000, 1_000_000)),
        ],
    )
    return frame, metadata


def build_centre(
    root: Path, server_id: str, database_url: str | None, keys: dict[str, Ed25519PrivateKey]
) -> ServerConfig:
    """A new centre in `root` on `database_url` (None: SQLite in `root`): projects p1 and p2,
    the researchers of RESEARCHERS, auditor `eve` (key `keys["eve"]`) and the datasets people
    (tracker target), census, census2 (p2) and accounts (goes to review)."""
    config = initialise(root, server_id=server_id, database_url=database_url)
    data = DataDir(root)
    census = generate_census(CENSUS_ROWS, seed=7)
    frame, metadata = accounts()
    store = Store(data.database_url(config))
    try:
        for project in sorted(set(RESEARCHERS.values())):
            store.add_project(project)
        for name, project in RESEARCHERS.items():
            pub = keys[name].public_key()
            store.add_researcher(name, public_key_text(pub), fingerprint(pub), [project])
        pub = keys[AUDITOR].public_key()
        store.add_auditor(AUDITOR, public_key_text(pub), fingerprint(pub))
        datasets = [
            ("people", people(), people_metadata("people"), "p1"),
            ("census", census, census_metadata("census"), "p1"),
            ("census2", census.head(1000), census_metadata("census2"), "p2"),
            ("accounts", frame, metadata, "p1"),
        ]
        for name, table, meta, project in datasets:
            register_dataset(data, store, name=name, frame=table, metadata=meta, project=project)
    finally:
        store.close()
    return config


#: A worker that sent no heartbeat for this long is presumed dead (production: 30 s).
LEASE_SECONDS = 4.0


def use_queue(root: Path, pools: dict[str, str]) -> None:
    """Switch the centre in `root` to execution = "queue" (workers run the steps)."""
    path = DataDir(root).config_path
    config = yaml.safe_load(path.read_text())
    config["execution"] = "queue"
    config["queue"] = {"lease_seconds": LEASE_SECONDS, "wait_seconds": 60, "pools": pools}
    path.write_text(yaml.safe_dump(config))


def start_worker(root: Path, log: Path, *options: str) -> subprocess.Popen[bytes]:
    """`safeaccess-server worker` on `root` in a child process, once it says it is ready."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "safeaccess.server.admin.cli",
            "worker",
            "--data-dir",
            str(root),
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "safeaccess worker NAME ready", or EOF if it failed
    if b"ready" not in line:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"worker did not start: {log.read_text()[-2000:]}")
    return proc


def seal_for(
    keys: dict[str, Ed25519PrivateKey],
    server_id: str,
    researcher: str,
    dataset: str,
    analyses: list[Analysis],
) -> SealedSequence:
    """`analyses` sealed by `researcher` for `dataset` at centre `server_id`."""
    return seal(
        [to_body(a) for a in analyses],
        keys[researcher],
        researcher=researcher,
        project=RESEARCHERS[researcher],
        dataset=dataset,
        server=server_id,
    )


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL `proc` by its PID, then every process it leaves behind (its sandboxes)."""
    under = descendants(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    signal_all(under, signal.SIGKILL)


@dataclass
class Balanced:
    """The running cluster."""

    root: Path
    folder: Path
    postgres: ThrowawayPostgres
    url: str  # the centre's database
    server_id: str
    keys: dict[str, Ed25519PrivateKey]
    ca_file: Path
    haproxy: HAProxy
    ports: list[int]
    logs: list[Path]
    replicas: list[subprocess.Popen[bytes] | None] = field(default_factory=list)
    starts: int = 0
    execution: str = "local"
    workers: list[subprocess.Popen[bytes] | None] = field(default_factory=list)

    def seal(self, researcher: str, dataset: str, analyses: list[Analysis]) -> SealedSequence:
        return seal_for(self.keys, self.server_id, researcher, dataset, analyses)

    def session(self, researcher: str, **options: object) -> Session:
        """A researcher's session through HAProxy, over HTTPS, trusting the test CA only."""
        return connect(
            self.haproxy.url,
            self.keys[researcher],
            researcher,
            ca_bundle=self.ca_file,
            **options,
        )

    def key_file(self, name: str) -> Path:
        """`name`'s private key as a PEM file (for the command-line clients)."""
        path = self.folder / f"{name}.key"
        if not path.exists():
            path.touch(mode=0o600)
            path.write_bytes(
                self.keys[name].private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        return path

    def store(self) -> Store:
        return Store(self.url)

    def start_replica(self, i: int) -> None:
        """Start replica `i` (again) on its port, with a new log file."""
        self.starts += 1
        log = self.folder / f"replica{i}.{self.starts}.log"
        self.logs[i] = log
        self.replicas[i] = serve(self.root, self.ports[i], log)

    def kill_replica(self, i: int) -> None:
        """SIGKILL replica `i` by its PID, and the sandbox processes it leaves behind."""
        proc = self.replicas[i]
        assert proc is not None
        kill_tree(proc)
        self.replicas[i] = None

    def start_worker(self, i: int, *options: str) -> None:
        """Start worker `i` (again), two slots on the process backend unless `options` say."""
        self.starts += 1
        while len(self.workers) <= i:
            self.workers.append(None)
        log = self.folder / f"worker{i}.{self.starts}.log"
        self.workers[i] = start_worker(
            self.root, log, "--name", f"worker{i}", *(options or ("--slots", "2"))
        )

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker `i` by its PID, and its sandboxes."""
        proc = self.workers[i]
        assert proc is not None
        kill_tree(proc)
        self.workers[i] = None

    def worker_processes(self) -> list[int]:
        """The PIDs of every running worker and everything under it."""
        pids = []
        for proc in self.workers:
            if proc is not None:
                pids += [proc.pid, *descendants(proc.pid)]
        return pids

    def all_logs(self) -> list[Path]:
        return sorted([*self.folder.glob("replica*.log"), *self.folder.glob("worker*.log")])
