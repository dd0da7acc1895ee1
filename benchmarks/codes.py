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
Beside each end-to-end series it prints where the server spent the steps (wall and this
thread's CPU, medians over the timed runs): the step in the server (what is left of the end to
end is the HTTP request, the client's signing and reading, and waiting for a core), its sandbox
job, the output rules, the transactions that start and record it, and the query-set auditor's
admission: the check (`qss.gate`: the stable query set, `admit`, the domain grid), writing the
state file (`commit_for`: encoding, hashing, write, fsync), loading it, the full state written
in the background after the step is recorded (where the tree has one: `StateFiles.write_full`);
then the size of the sandbox's reply (the query set travels in it). The timers wrap those
functions from outside, so the same file measures an older checkout too.

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
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


class StepTimes:
    """Wall and thread-CPU seconds of the step's parts in the server (the sandbox job, the
    rules, the transactions, the auditor's admission and its parts), and the sizes of the
    sandbox's replies, recorded by wrapping the functions the server calls (benchmark-only)."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.replies: list[int] = []
        from safeaccess.sandbox.process import backend as process_backend
        from safeaccess.server.qss import admission
        from safeaccess.server.qss.gate import StateFiles
        from safeaccess.server.service import Service
        from safeaccess.server.steps import pipeline
        from safeaccess.server.store import Store

        # The step in the server (what is left of the end-to-end time is the HTTP request, the
        # client's signing and reading, and the wait for a core), then its parts.
        self._wrap(Service, "open_sequence", "the step in the server (Service.open_sequence)")
        self._wrap(process_backend.ProcessBackend, "run", "  sandbox job (backend.run)")
        self._wrap(pipeline, "check", "  output rules (rules.engine.check)")
        self._wrap(Store, "create_sequence", "  step started (one transaction)")
        self._wrap(Store, "settle_step", "  step recorded (one transaction)")
        self._wrap(admission.Admission, "_gate", "  admission, whole")
        self._wrap(admission, "gate", "    check (qss.gate: query set, admit, grid)")
        self._wrap(admission, "commit_for", "    state write (encode, hash, write, fsync)")
        self._wrap(StateFiles, "load", "    state load")
        if hasattr(StateFiles, "write_full"):  # the full state, written after the step's record
            self._wrap(StateFiles, "write_full", "    (background) full state write, off the path")
        self._wrap(admission, "admit_populations", "    populations")
        decode = process_backend.decode_reply

        def sized(data: Any) -> Any:
            self.replies.append(len(data))
            return decode(data)

        process_backend.decode_reply = sized  # type: ignore[assignment]

    def _wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.rows[label].append((time.perf_counter() - wall, time.thread_time() - cpu))

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.rows.clear()
        self.replies.clear()

    def report(self, skip: int) -> None:
        """Medians over the calls after the first `skip` steps (the warm-up)."""
        for label, rows in self.rows.items():
            runs = rows[skip:]
            if runs:
                print(
                    f"    {label:<48} wall {statistics.median(w for w, _ in runs) * 1000:7.1f} ms"
                    f"  cpu {statistics.median(c for _, c in runs) * 1000:7.1f} ms"
                    f"  (max wall {max(w for w, _ in runs) * 1000:.1f} ms, {len(runs)} calls)"
                )
        if self.replies:
            print(f"    sandbox reply: {statistics.median(self.replies[skip:]) / 2**20:.2f} MiB")


def timed(
    label: str, fn: Callable[[], object], repeat: int, cpu: list[float] | None = None
) -> list[float]:
    """Seconds of one warm-up call (first) and `repeat` timed calls; printed as they come.
    `cpu` (when given) receives this process's CPU seconds (all its threads) per call."""
    times = []
    for _ in range(repeat + 1):
        start, used = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - start)
        if cpu is not None:
            cpu.append(time.process_time() - used)
    print(line(label, times), flush=True)
    return times


def slowest(times: list[float], cpu: list[float], parts: StepTimes) -> None:
    """Where the slowest timed run went: its wall time, this process's CPU in it (the server,
    the HTTP client, the background full write; not the sandbox's forked job), the admission's
    wall and CPU, and the machine's load: a tail whose wall time is far above its CPU waited."""
    at = max(range(1, len(times)), key=lambda i: times[i])
    whole = parts.rows.get("  admission, whole", [])
    admission = whole[at] if at < len(whole) else (0.0, 0.0)
    print(
        f"    slowest run: {times[at]:.3f} s wall, this process's CPU {cpu[at]:.3f} s (median "
        f"{statistics.median(cpu[1:]):.3f} s), admission {admission[0] * 1000:.0f} ms wall / "
        f"{admission[1] * 1000:.0f} ms CPU; load average {os.getloadavg()[0]:.1f}"
    )


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
        parts = StepTimes()
        with service, EmbeddedServer(create_app(service)) as server:
            print(f"sandbox backend: {service.backend.name}")
            url, sid = server.url, service.server_id
            for name in ("census", "plain"):
                parts.reset()
                cpu: list[float] = []
                results[f"end to end, {name}"] = timed(
                    f"end to end, {name}",
                    lambda n=name: bench.sequence(url, sid, n, [TABLE]),
                    args.repeat,
                    cpu,
                )
                parts.report(skip=1)
                slowest(results[f"end to end, {name}"], cpu, parts)
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
