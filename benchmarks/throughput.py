"""Throughput of the whole centre: the process backend's fork server against its warm sandboxes.

In one run, on a generated census of `--rows` people and a frequency table (region x sex):

1. throughput with `--researchers` researchers each revealing `--steps-each` steps concurrently,
   through the real server over HTTP, with the fork server (the default) and with the earlier
   warm-sandbox mode, and the ratio between them (target: >= 10x and >= 15 steps/s);
2. per-job overhead of the fork server over the same job computed in-process (the runner's own
   `run_request` reading the Parquet file), both measured back to back (target: <= 30 ms median);
3. latency per step at `--many` concurrent researchers on the fork server (target: p95 < 2 s);
4. server CPU per step: CPU time of this process (server and clients share it, so this is an
   upper bound of the server's share) per step in the fork server's throughput run, with the
   clients' own signing measured separately and subtracted.

    python benchmarks/throughput.py [--rows 100000] [--researchers 8] [--steps-each 4] [--many 16]

Needs a root server (the fork server's jobs switch to fresh uids); prints the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.analyses import FrequencyTable, to_body
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.sandbox.backend import Job, RunnerRequest
from safeaccess.sandbox.process import Mode, ProcessBackend
from safeaccess.sandbox.runner import run_request
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


def _sequence(
    url: str, name: str, key: Ed25519PrivateKey, steps: int, server_id: str
) -> list[float]:
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


@contextmanager
def _centre(root: Path, mode: Mode) -> Iterator[tuple[Service, EmbeddedServer]]:
    config = DataDir(root).load_config()
    backend = ProcessBackend(limits=config.sandbox.limits, mode=mode)
    backend.check_available()
    service = Service(root, backend=backend)
    with service, EmbeddedServer(create_app(service)) as server:
        yield service, server
    backend.close()


def _concurrent(
    server: EmbeddedServer, service: Service, keys: dict[str, Ed25519PrivateKey], steps: int
) -> tuple[float, list[float], float]:
    """(steps/s, per-step latencies, process CPU seconds) for all `keys` at once."""
    latencies: list[float] = []
    lock = threading.Lock()

    def one(name: str) -> None:
        times = _sequence(server.url, name, keys[name], steps, service.server_id)
        with lock:
            latencies.extend(times)

    threads = [threading.Thread(target=one, args=(name,)) for name in keys]
    cpu = time.process_time()
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return len(latencies) / wall, latencies, time.process_time() - cpu


def _client_cpu_per_step(steps: int) -> float:
    """CPU of the client side of one step (sealing, signing requests) without a server."""
    key = Ed25519PrivateKey.generate()
    body = to_body(ANALYSIS)
    start = time.process_time()
    for _ in range(20):
        seal([body] * steps, key, researcher="r", project="bench", dataset="census", server="b")
    return (time.process_time() - start) / 20 / steps


def _job_overhead(dataset: Path, jobs: int) -> tuple[float, float]:
    """Median in-process job and median fork server job (seconds), interleaved."""
    body = json.loads(to_body(ANALYSIS))
    metadata = census_metadata().model_dump(mode="json")
    request = RunnerRequest(analysis=body, metadata=metadata, dataset_path=str(dataset))
    backend = ProcessBackend(mode="forkserver")
    job = Job(job_id="o", analysis=body, metadata=metadata, dataset=dataset)
    local: list[float] = []
    forked: list[float] = []
    try:
        backend.run(job)  # template start-up, not counted
        for _ in range(jobs):
            start = time.perf_counter()
            response = run_request(request, str(dataset))
            local.append(time.perf_counter() - start)
            assert response.ok
            start = time.perf_counter()
            backend.run(job)
            forked.append(time.perf_counter() - start)
    finally:
        backend.close()
    return statistics.median(local), statistics.median(forked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--researchers", type=int, default=8)
    parser.add_argument("--steps-each", type=int, default=4)
    parser.add_argument("--many", type=int, default=16, help="researchers for the latency run")
    parser.add_argument("--jobs", type=int, default=40, help="jobs for the overhead medians")
    args = parser.parse_args()

    frame = generate_census(args.rows)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus "
        f"(usable {len(os.sched_getaffinity(0))}), Python {platform.python_version()}; "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )
    print(f"analysis: frequency table region x sex on {args.rows:,} rows")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        keys = _prepare(root, frame, max(args.researchers, args.many))
        team = dict(list(keys.items())[: args.researchers])
        figures: dict[str, float] = {}
        cpu_per_step = 0.0
        for mode in ("warm", "forkserver"):
            with _centre(root, mode) as (service, server):
                # Warm-up (template or warm sandbox, page cache), not counted.
                _sequence(server.url, "r0", keys["r0"], 1, service.server_id)
                rate, latencies, cpu = _concurrent(server, service, team, args.steps_each)
                figures[mode] = rate
                print(
                    f"[{mode}] {args.researchers} researchers x {args.steps_each} steps: "
                    f"{rate:.2f} steps/s; per-step median "
                    f"{statistics.median(latencies) * 1000:.0f} ms, p95 "
                    f"{_percentile(latencies, 0.95) * 1000:.0f} ms"
                )
                if mode == "forkserver":
                    cpu_per_step = cpu / len(latencies)
                    rate_many, many, _ = _concurrent(server, service, keys, args.steps_each)
                    print(
                        f"[forkserver] {args.many} researchers x {args.steps_each} steps: "
                        f"{rate_many:.2f} steps/s; per-step median "
                        f"{statistics.median(many) * 1000:.0f} ms, p95 "
                        f"{_percentile(many, 0.95) * 1000:.0f} ms (target < 2000 ms)"
                    )
        ratio = figures["forkserver"] / figures["warm"]
        print(
            f"throughput: fork server {figures['forkserver']:.2f} steps/s vs warm sandboxes "
            f"{figures['warm']:.2f} steps/s = {ratio:.1f}x (targets >= 10x and >= 15 steps/s)"
        )
        client = _client_cpu_per_step(args.steps_each)
        print(
            f"CPU of this process per step (server + clients): {cpu_per_step * 1000:.0f} ms; "
            f"clients' sealing alone {client * 1000:.1f} ms; server share <= "
            f"{(cpu_per_step - client) * 1000:.0f} ms (target <= 25 ms)"
        )
        dataset = root / "datasets" / "census" / "v1.parquet"
        local, forked = _job_overhead(dataset, args.jobs)
        print(
            f"one job: in-process (read Parquet + table) median {local * 1000:.1f} ms, fork "
            f"server median {forked * 1000:.1f} ms; overhead {(forked - local) * 1000:.1f} ms "
            "(target <= 30 ms)"
        )


if __name__ == "__main__":
    main()
