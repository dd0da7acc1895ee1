"""What deploy/grafana/safeaccess-dashboard.json shows after a short load run (issue 43).

One replica and two `safeaccess-server worker` processes (`--metrics-port`) on a throwaway
PostgreSQL in queue mode: `--researchers` researchers each reveal `--steps-each` tables at once
(`--rounds` times), a few steps fail (a column the dataset does not have) and a client signs
with a wrong key; then the replica's and the workers' `/metrics` are scraped and every panel of
the dashboard is computed from them as its PromQL does over the run (a rate is the counter's
increase over the run's seconds; a quantile is `histogram_quantile` over the summed buckets;
the queue's gauges are the replica's), and printed.

    python benchmarks/dashboard.py [--rows 100000] [--researchers 8] [--steps-each 4] [--rounds 3]

Needs PostgreSQL's server binaries on PATH and root for the process sandbox, like cluster.py.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client.parser import text_string_to_metric_families

from census_centre import run_concurrently
from cluster import CLI, _centre, _process, _replica
from safeaccess.client.analyses import FrequencyTable, to_body
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.server.config import DataDir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from pg_throwaway import ThrowawayPostgres, free_port

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str) -> Samples:
    found: Samples = defaultdict(list)
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for sample in family.samples:
            found[sample.name].append((dict(sample.labels), sample.value))
    return found


def summed(scrapes: list[Samples], name: str, by: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    """`sum by (BY) (NAME)` over every process."""
    total: dict[tuple[str, ...], float] = defaultdict(float)
    for samples in scrapes:
        for labels, value in samples.get(name, []):
            total[tuple(labels.get(k, "") for k in by)] += value
    return dict(total)


def quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus's `histogram_quantile` over cumulative buckets (upper bound -> count)."""
    bounds = sorted(buckets)
    count = buckets[math.inf]
    if count == 0:
        return math.nan
    rank = q * count
    below, lower = 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == math.inf:
                return lower
            return lower + (bound - lower) * (rank - below) / (buckets[bound] - below)
        below, lower = buckets[bound], bound
    return lower


def histogram(
    scrapes: list[Samples], name: str, by: tuple[str, ...]
) -> dict[tuple[str, ...], dict[float, float]]:
    found: dict[tuple[str, ...], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for samples in scrapes:
        for labels, value in samples.get(f"{name}_bucket", []):
            key = tuple(labels.get(k, "") for k in by)
            found[key][float(labels["le"])] += value
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--researchers", type=int, default=8)
    parser.add_argument("--steps-each", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    postgres = ThrowawayPostgres()
    postgres.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root, keys, _ = _centre(
                postgres, Path(tmp), "queue", args.rows, args.researchers, "queue"
            )
            server_id = DataDir(root).load_config().server_id
            ports = [free_port(), free_port()]
            with ExitStack() as stack:
                for i, port in enumerate(ports):
                    stack.enter_context(
                        _process(
                            [
                                *(*CLI, "worker", "--data-dir", str(root), "--slots", "1"),
                                *("--name", f"w{i + 1}", "--metrics-port", str(port)),
                            ],
                            ready="ready",
                        )
                    )
                api = stack.enter_context(_replica(root))
                started = time.monotonic()
                steps = 0
                for _ in range(args.rounds):
                    latencies, _wall = run_concurrently(api, keys, args.steps_each, server_id)
                    steps += len(latencies)
                # Steps that fail (an unknown column) and a request signed with a wrong key.
                name, key = next(iter(keys.items()))
                bad = FrequencyTable(rows=["no_such_column"])
                with connect(api, key, name) as session:
                    for _ in range(3):
                        sealed = seal(
                            [to_body(bad)],
                            key,
                            researcher=name,
                            project="bench",
                            dataset="census",
                            server=server_id,
                        )
                        session.open(sealed)
                try:
                    with connect(api, Ed25519PrivateKey.generate(), name) as session:
                        session.open(sealed)
                except Exception as exc:  # refused: that is the point
                    print(f"wrong key refused: {type(exc).__name__}")
                seconds = time.monotonic() - started
                time.sleep(1.0)  # the replica's queue gauges refresh
                scrapes = [scrape(f"http://127.0.0.1:{p}/metrics") for p in ports]
                replica = scrape(f"{api}/metrics")
            everyone = [*scrapes, replica]
            print(f"load: {steps} table steps in {args.rounds} rounds + 3 failing, {seconds:.1f} s")
            print("\n[Steps per second by kind and outcome] (sum by (kind, outcome))")
            for (kind, outcome), n in sorted(
                summed(everyone, "safeaccess_steps_total", ("kind", "outcome")).items()
            ):
                print(f"  {kind} {outcome}: {n:.0f} steps, {n / seconds:.2f}/s")
            print("\n[Step duration p50 / p95 by kind]")
            for (kind,), buckets in histogram(
                everyone, "safeaccess_step_seconds", ("kind",)
            ).items():
                print(
                    f"  {kind}: p50 {quantile(0.5, buckets) * 1000:.0f} ms, "
                    f"p95 {quantile(0.95, buckets) * 1000:.0f} ms"
                )
            print("\n[Query-set admission p50 / p95]")
            for _key, buckets in histogram(everyone, "safeaccess_admission_seconds", ()).items():
                print(
                    f"  p50 {quantile(0.5, buckets) * 1000:.1f} ms, "
                    f"p95 {quantile(0.95, buckets) * 1000:.1f} ms"
                )
            print("\n[Queue depth / jobs running / failed] (the replica's safeaccess_jobs)")
            for (queue, state), n in sorted(
                summed([replica], "safeaccess_jobs", ("queue", "state")).items()
            ):
                print(f"  {queue} {state}: {n:.0f}")
            print("\n[Workers: seconds since last heartbeat]")
            for (worker,), age in sorted(
                summed([replica], "safeaccess_worker_heartbeat_age_seconds", ("worker",)).items()
            ):
                print(f"  {worker}: {age:.1f} s")
            print("\n[Sandbox runs and failures per second]")
            for (backend,), n in summed(
                everyone, "safeaccess_sandbox_runs_total", ("backend",)
            ).items():
                print(f"  runs {backend}: {n:.0f}, {n / seconds:.2f}/s")
            for (backend, reason), n in summed(
                everyone, "safeaccess_sandbox_failures_total", ("backend", "reason")
            ).items():
                print(f"  failures {backend} {reason}: {n:.0f}")
            print("\n[DP budget charged] (no DP dataset in this run)")
            for (dataset,), n in summed(
                everyone, "safeaccess_dp_charge_total", ("dataset",)
            ).items():
                print(f"  {dataset}: {n:.3f}")
            print("\n[Authentication failures per minute]")
            for (kind, reason), n in summed(
                everyone, "safeaccess_auth_failures_total", ("kind", "reason")
            ).items():
                print(f"  {kind} {reason}: {n:.0f}, {n / seconds * 60:.2f}/min")
            print("\n[Sandbox mode per process]")
            for (backend, mode), n in summed(
                everyone, "safeaccess_sandbox_mode", ("backend", "mode")
            ).items():
                print(f"  {backend} {mode}: {n:.0f} process(es)")
    finally:
        postgres.remove()


if __name__ == "__main__":
    main()
