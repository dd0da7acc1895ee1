"""What the step benchmarks share: a census centre with N researchers, one sequence of
frequency tables through the real client, and a percentile. Imported by `step_latency.py`
and `throughput.py` (run from this folder, so it is on the path); not a benchmark itself."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pandas as pd
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.analyses import FrequencyTable, to_body
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.server.config import DataDir, initialise
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo.data import census_metadata
from safeaccess.server.store import Store

ANALYSIS = FrequencyTable(rows=["region"], cols=["sex"])


def percentile(values: list[float], q: float) -> float:
    """The q-quantile of `values`, linearly interpolated."""
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def prepare(
    root: Path, frame: pd.DataFrame, researchers: int, database_url: str | None = None
) -> dict[str, Ed25519PrivateKey]:
    """A data directory at `root` with project `bench`, researchers r0..r{n-1} and the census
    (on `database_url`, else SQLite in `root`)."""
    config = initialise(root, server_id="bench", database_url=database_url)
    data = DataDir(root)
    keys = {f"r{i}": Ed25519PrivateKey.generate() for i in range(researchers)}
    store = Store(data.database_url(config))
    try:
        store.add_project("bench")
        for name, key in keys.items():
            pub = key.public_key()
            store.add_researcher(name, public_key_text(pub), fingerprint(pub), ["bench"])
        register_dataset(
            data, store, name="census", frame=frame, metadata=census_metadata(), project="bench"
        )
    finally:
        store.close()
    return keys


def run_sequence(
    url: str, name: str, key: Ed25519PrivateKey, steps: int, server_id: str
) -> list[float]:
    """Open and reveal a sequence of `steps` tables; the latency of each step, in seconds."""
    body = to_body(ANALYSIS)
    sealed = seal(
        [body] * steps, key, researcher=name, project="bench", dataset="census", server=server_id
    )
    times = []
    with connect(url, key, name) as session:
        start = time.perf_counter()
        result = session.open(sealed)
        times.append(time.perf_counter() - start)
        for j in range(2, steps + 1):
            assert result.released, result.describe()
            start = time.perf_counter()
            result = session.reveal(result.sequence_id, sealed, j)
            times.append(time.perf_counter() - start)
        assert result.released and result.last
    return times


def run_concurrently(
    url: str, keys: dict[str, Ed25519PrivateKey], steps: int, server_id: str
) -> tuple[list[float], float]:
    """Every researcher of `keys` runs a sequence of `steps` tables at once, one thread each;
    (the latency of every step, the wall time of the whole)."""
    latencies: list[float] = []
    lock = threading.Lock()

    def one(name: str) -> None:
        times = run_sequence(url, name, keys[name], steps, server_id)
        with lock:
            latencies.extend(times)

    threads = [threading.Thread(target=one, args=(name,)) for name in keys]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - start
