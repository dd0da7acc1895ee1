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
import time
from pathlib import Path

import pandas as pd

from census_centre import percentile, prepare, run_concurrently, run_sequence
from safeaccess.server.demo.data import generate_census
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service


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
        keys = prepare(root, frame, args.researchers)
        service = Service(root)
        with service, EmbeddedServer(create_app(service)) as server:
            print(
                f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python "
                f"{platform.python_version()}; sandbox backend: {service.backend.name}"
            )
            print(f"analysis: frequency table region x sex on {args.rows:,} rows")
            # Warm-up step (imports, page cache), not counted.
            run_sequence(server.url, "r0", keys["r0"], 1, service.server_id)

            sequential: list[float] = []
            sequential.extend(
                run_sequence(server.url, "r0", keys["r0"], args.steps, service.server_id)
            )

            stored = pd.read_parquet(root / "datasets" / "census" / "v1.parquet")
            local: list[float] = []
            for _ in range(max(args.steps, 20)):
                start = time.perf_counter()
                pd.crosstab(stored["region"], stored["sex"])
                local.append(time.perf_counter() - start)

            med, p95 = statistics.median(sequential), percentile(sequential, 0.95)
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

            concurrent, wall = run_concurrently(
                server.url, keys, args.steps_each, service.server_id
            )
            total = len(concurrent)
            print(
                f"{args.researchers} concurrent researchers x {args.steps_each} steps: "
                f"{total} steps in {wall:.1f} s = {total / wall:.2f} steps/s; per-step median "
                f"{statistics.median(concurrent) * 1000:.0f} ms, p95 "
                f"{percentile(concurrent, 0.95) * 1000:.0f} ms"
            )


if __name__ == "__main__":
    main()
