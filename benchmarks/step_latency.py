"""Benchmark one tit-for-tat step through the whole server pipeline, over real HTTP.

Measures, for a frequency table (region x sex) on a generated census of `--rows` people:

- median and p95 wall time per step as the researcher sees it (signed request -> protocol
  verification -> validation -> sandbox run -> rules check -> one transaction -> response),
- the same `pandas.crosstab` call in-process on data already in memory, and the overhead
  (milliseconds and ratio) of doing it safely,
- throughput with `--researchers` researchers each running a sequence concurrently.

    python benchmarks/step_latency.py [--rows 100000] [--steps 15] [--researchers 8]

Honours SAFEACCESS_SANDBOX_BACKEND (process | docker).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.analyses import FrequencyTable, to_body
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.server.api import create_app
from safeaccess.server.config import DataDir, initialise
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo_data import census_metadata, generate_census
from safeaccess.server.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store import Store

ANALYSIS = FrequencyTable(rows=["region"], cols=["sex"])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _prepare(root: Path, frame: pd.DataFrame, researchers: int) -> dict[str, Ed25519PrivateKey]:
    config = initialise(root, server_id="bench")
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


def _run_sequence(
    url: str, name: str, key: Ed25519PrivateKey, steps: int, server_id: str, times: list[float]
) -> None:
    body = to_body(ANALYSIS)
    sealed = seal(
        [body] * steps, key, researcher=name, project="bench", dataset="census", server=server_id
    )
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=15, help="steps timed one after another")
    parser.add_argument("--researchers", type=int, default=8)
    parser.add_argument("--steps-each", type=int, default=4, help="steps per concurrent researcher")
    args = parser.parse_args()

    frame = generate_census(args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        keys = _prepare(root, frame, args.researchers)
        service = Service(root)
        with service, EmbeddedServer(create_app(service)) as server:
            print(
                f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python "
                f"{platform.python_version()}; sandbox backend: {service.backend.name}"
            )
            print(f"analysis: frequency table region x sex on {args.rows:,} rows")
            # Warm-up step (imports, page cache), not counted.
            _run_sequence(server.url, "r0", keys["r0"], 1, service.server_id, [])

            sequential: list[float] = []
            _run_sequence(server.url, "r0", keys["r0"], args.steps, service.server_id, sequential)

            stored = pd.read_parquet(root / "datasets" / "census" / "v1.parquet")
            local: list[float] = []
            for _ in range(max(args.steps, 20)):
                start = time.perf_counter()
                pd.crosstab(stored["region"], stored["sex"])
                local.append(time.perf_counter() - start)

            med, p95 = statistics.median(sequential), _percentile(sequential, 0.95)
            local_med = statistics.median(local)
            print(
                f"full pipeline per step: median {med * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms "
                f"({len(sequential)} steps)"
            )
            sandbox = [
                step.wall_seconds
                for seq in service.store.list_sequences("r0")
                for step in service.store.steps(seq.id)
                if step.wall_seconds is not None
            ][-len(sequential) :]
            print(
                f"  of which inside the sandbox backend: median "
                f"{statistics.median(sandbox) * 1000:.0f} ms"
            )
            print(f"pandas.crosstab in-process: median {local_med * 1000:.1f} ms")
            print(
                f"overhead: {(med - local_med) * 1000:.0f} ms per step, "
                f"ratio {med / local_med:.0f}x"
            )

            concurrent: list[float] = []
            threads = [
                threading.Thread(
                    target=_run_sequence,
                    args=(
                        server.url,
                        name,
                        keys[name],
                        args.steps_each,
                        service.server_id,
                        concurrent,
                    ),
                )
                for name in keys
            ]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - start
            total = len(concurrent)
            print(
                f"{args.researchers} concurrent researchers x {args.steps_each} steps: "
                f"{total} steps in {wall:.1f} s = {total / wall:.2f} steps/s; per-step median "
                f"{statistics.median(concurrent) * 1000:.0f} ms, p95 "
                f"{_percentile(concurrent, 0.95) * 1000:.0f} ms"
            )


if __name__ == "__main__":
    main()
