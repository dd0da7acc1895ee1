"""A checked two-way table at 10 M records on stored code arrays, end to end, beside pd.crosstab.

In one process, on the census of `scale.py` (region 40 levels x sex; a person number as record
key):

- the checked frequency table region x sex end to end through the real server over HTTP with
  the process sandbox (signed request -> fork server job on the version's memory-mapped code
  arrays -> rules -> query-set audit -> one transaction -> response), each run a new sequence;
- the same on a second registration of the same data whose code arrays were removed (a version
  registered before code arrays existed: the jobs code the values themselves);
- the sandbox job alone (`backend.run`, fork server, no server around it) for both;
- the table and its facts in process, on the codes and on the decoded frame;
- a bare `pd.crosstab(region, sex)` on the same data, in memory, and read from the Parquet file.

Every figure is the worst and the median of `--repeat` runs after one warm-up run (the first job
of a dataset version starts its fork server template: loading the version, not a step's cost).

    python benchmarks/codes.py [--rows 10000000] [--repeat 3] [--strings]

Run it with the virtual environment's python by its absolute path (bubblewrap executes it inside
the sandbox). Target: the checked table end to end <= 0.3 s and below the bare crosstab.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from safeaccess.client.analyses import to_body
from safeaccess.rules.engine import check
from safeaccess.sandbox.backend import Job
from safeaccess.sandbox.codes import codes_dir, load_codes
from safeaccess.sandbox.runner.compute.tables import frequency_table
from safeaccess.sandbox.runner.stored_codes import using
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from scale import TABLE, Bench, census, metadata


def timed(label: str, fn: Callable[[], object], repeat: int) -> list[float]:
    """Seconds of one warm-up call (first) and `repeat` timed calls; printed as they come."""
    times = []
    for _ in range(repeat + 1):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    print(line(label, times), flush=True)
    return times


def line(label: str, times: list[float]) -> str:
    """A row: worst and median of the timed runs (the warm-up shown apart)."""
    runs = times[1:]
    return (
        f"  {label:<52} worst {max(runs):6.3f} s  median {statistics.median(runs):6.3f} s"
        f"  (warm-up {times[0]:.3f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--strings",
        action="store_true",
        help="store the key columns as text rather than pandas Categoricals (as a CSV "
        "registration does): the jobs without code arrays then factorise strings",
    )
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp) / "data")
        frame = census(args.rows)
        if args.strings:
            for name in frame.columns:
                if isinstance(frame[name].dtype, pd.CategoricalDtype):
                    frame[name] = frame[name].astype(object)
        print(
            f"registered {args.rows:,} rows with code arrays in {bench.register('census', frame):.1f} s"
        )
        print(f"registered again (codes removed after) in {bench.register('plain', frame):.1f} s")
        del frame
        stored = bench.root / "datasets" / "census" / "v1.parquet"
        plain = bench.root / "datasets" / "plain" / "v1.parquet"
        shutil.rmtree(codes_dir(plain))
        size = sum(p.stat().st_size for p in codes_dir(stored).iterdir())
        print(
            f"code arrays: {size / 2**20:.1f} MiB beside a {stored.stat().st_size / 2**20:.1f} MiB Parquet file"
        )

        print(f"\nchecked frequency table region x sex on {args.rows:,} rows")
        results: dict[str, list[float]] = {}
        service = Service(bench.root)
        with service, EmbeddedServer(create_app(service)) as server:
            print(f"sandbox backend: {service.backend.name}")
            url, sid = server.url, service.server_id
            for name in ("census", "plain"):
                results[f"end to end, {name}"] = timed(
                    f"end to end, {name}",
                    lambda n=name: bench.sequence(url, sid, n, [TABLE]),
                    args.repeat,
                )
                path = stored if name == "census" else plain
                job = Job(
                    job_id="bench",
                    analysis=json.loads(to_body(TABLE)),
                    metadata=metadata(name).model_dump(mode="json"),
                    dataset=path,
                    limits=bench.data.load_config().sandbox.limits,
                )
                results[f"sandbox job alone, {name}"] = timed(
                    f"sandbox job alone, {name}", lambda j=job: service.backend.run(j), args.repeat
                )

        data = pq.read_table(stored).to_pandas()
        codes = load_codes(stored)
        meta = metadata("census")

        def table(on_codes: bool) -> None:
            with using(codes if on_codes else None):
                check(frequency_table(TABLE, data, meta, len(data)))

        results["in process, table + checks on codes"] = timed(
            "in process, table + checks on codes", lambda: table(True), args.repeat
        )
        results["in process, table + checks on the frame"] = timed(
            "in process, table + checks on the frame", lambda: table(False), args.repeat
        )
        results["bare pd.crosstab, in memory"] = timed(
            "bare pd.crosstab, in memory",
            lambda: pd.crosstab(data["region"], data["sex"]),
            args.repeat,
        )
        results["bare pd.crosstab, read 2 columns + crosstab"] = timed(
            "bare pd.crosstab, read 2 columns + crosstab",
            lambda: pd.crosstab(
                *pd.read_parquet(stored, columns=["region", "sex"]).to_dict("series").values()
            ),
            args.repeat,
        )
        ours = max(results["end to end, census"][1:])
        bare = statistics.median(results["bare pd.crosstab, in memory"][1:])
        print(
            f"  end to end on codes, worst: {ours:.3f} s (target 0.3 s): "
            f"{ours / bare:.2f}x the bare crosstab in memory"
        )


if __name__ == "__main__":
    main()
