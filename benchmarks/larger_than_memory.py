"""Benchmark a dataset larger than the job's memory: storage "duckdb" through the real sandbox.

Generates a Parquet dataset of `--rows` records (three integer categorical columns and a
numeric one, written in chunks with pyarrow so the generator stays small) in a temporary
directory, deleted afterwards. Then, with a job memory limit of `--memory-mb` (well below what
pandas needs for the file), it runs through the process sandbox (bubblewrap, rlimits, seccomp;
forked from the fork server's template, which reports each job's own rusage: its peak RSS):

- a checked 2-way frequency table (region x sex, margins; the default rules check it),
- a grouped mean (magnitude table of income by region),
- a summary (count, mean, sd and median of income by sex), which DuckDB does not compute: the
  job reads only its two columns and runs the in-memory code on them,

and prints each job's wall time and peak RSS. Before them, in a fresh interpreter,
`safeaccess-server dataset add` registers the file (a batch at a time: storage "duckdb"), with its
time and peak RSS. Beside them, in fresh interpreters started by this process: pandas loading the
same file, once under the same memory limit (RLIMIT_DATA, as the sandbox sets it) and once
without, with its time and peak RSS.

    python benchmarks/larger_than_memory.py                # 100 M rows, 2 GiB jobs
    python benchmarks/larger_than_memory.py --rows 2000000 --memory-mb 256
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CHUNK = 5_000_000
COLUMNS = [
    {"name": "region", "type": "categorical", "levels": list(range(12))},
    {"name": "sex", "type": "categorical", "levels": [1, 2]},
    {"name": "age_band", "type": "categorical", "levels": list(range(16))},
    {"name": "income", "type": "continuous"},
]
TABLE = {"kind": "frequency_table", "rows": ["region"], "cols": ["sex"], "margins": True}
MEAN = {"kind": "magnitude_table", "rows": ["region"], "value": "income", "agg": "mean"}
SUMMARY = {
    "kind": "summary",
    "variables": ["income"],
    "by": ["sex"],
    "statistics": ["count", "mean", "sd", "median"],
}


def generate(path: Path, rows: int, seed: int = 1) -> None:
    """Write `rows` records in chunks of CHUNK (int64 keys, as most Parquet exports hold them)."""
    rng = np.random.default_rng(seed)
    schema = pa.schema(
        [
            ("region", pa.int64()),
            ("sex", pa.int64()),
            ("age_band", pa.int64()),
            ("income", pa.float64()),
        ]
    )
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        done = 0
        while done < rows:
            n = min(CHUNK, rows - done)
            income = np.round(rng.gamma(2.0, 15_000.0, n), 2)
            income[rng.random(n) < 0.01] = np.nan
            chunk = pa.table(
                {
                    "region": rng.integers(0, 12, n),
                    "sex": rng.integers(1, 3, n),
                    "age_band": rng.integers(0, 16, n),
                    "income": income,
                },
                schema=schema,
            )
            writer.write_table(chunk, row_group_size=1_000_000)
            done += n


def rows_of(path: str) -> int:
    """Records in the Parquet file (its footer)."""
    return int(pq.ParquetFile(path).metadata.num_rows)


def _sandbox_jobs(path: str, memory_mb: int, out: Any) -> None:
    """In a fresh child: both jobs through the process backend's fork server (a root server's
    default), whose template reports each job's own rusage: its peak RSS."""
    from safeaccess.rules.engine import check
    from safeaccess.sandbox.backend import AnalysisFailed, Job, Limits
    from safeaccess.sandbox.process import ProcessBackend

    # The reply carries the query set, 4 bytes per stored record (400 MB at 100 M): the output
    # cap is raised to let it through (the default, 64 MiB, suits up to 16 M records).
    limits = Limits(
        memory_mb=memory_mb,
        cpu_seconds=3600,
        wall_seconds=3600.0,
        tmp_mb=1024,
        max_output_bytes=max(64 << 20, 8 * rows_of(path) + (16 << 20)),
    )
    backend = ProcessBackend(limits)
    results: list[dict[str, Any]] = []
    try:
        if backend.mode != "forkserver":
            raise RuntimeError("the fork server (and so the job's rusage) needs root")
        backend.check_available()
        metadata = {"name": "big", "storage": "duckdb", "columns": COLUMNS}

        def job(analysis: dict[str, Any]) -> Job:
            return Job(
                job_id="big",
                analysis=analysis,
                metadata=metadata,
                dataset=Path(path),
                limits=limits,
            )

        # Start the template (imports, no data) with an analysis refused before any record
        # is read (a script), so that the figures below are the jobs' own.
        with contextlib.suppress(AnalysisFailed):
            backend.run(job({"kind": "script", "code": "result = 1"}))
        for analysis in (TABLE, MEAN, SUMMARY):
            started = time.perf_counter()
            try:
                result = backend.run(job(analysis))
            except AnalysisFailed as exc:  # e.g. the columns beyond the job's memory
                results.append({"error": f"{exc.runner_code}: {exc}"})
                continue
            decision = check(result.output)
            wall = time.perf_counter() - started
            results.append(
                {"wall": wall, "peak": result.peak_rss_bytes or 0, "released": decision.verdict}
            )
        out.send(results)
    except Exception as exc:  # reported, not raised: the parent prints every row
        out.send([*results, {"error": f"{type(exc).__name__}: {exc}"}])
    finally:
        backend.close()


def _pandas_child(path: str) -> None:
    """Run as `--pandas-child PATH` in a fresh interpreter: pandas reads the file; prints its
    time and peak RSS as JSON. Only the load: at 100 M rows `pd.crosstab` alone takes several
    times the frame's memory (about 20 GiB peak measured), too much for a shared machine."""
    import pandas as pd

    try:
        started = time.perf_counter()
        pd.read_parquet(path)
        wall = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"wall": wall, "peak": peak}))
    except MemoryError:
        print(json.dumps({"error": "MemoryError"}))


def _register_child(path: str) -> None:
    """Run as `--register-child PATH` in a fresh interpreter: a new centre registers the file
    with `safeaccess-server dataset add`; prints the time and peak RSS as JSON."""
    from safeaccess.server.admin.cli import main as cli

    root = str(Path(path).parent / "centre")
    metadata = Path(path).parent / "big.json"
    metadata.write_text(json.dumps({"name": "big", "storage": "duckdb", "columns": COLUMNS}))
    with contextlib.redirect_stdout(sys.stderr):
        assert cli(["init", "--data-dir", root]) == 0
        assert cli(["project", "add", "p", "--data-dir", root]) == 0
        started = time.perf_counter()
        code = cli(
            [
                *("dataset", "add", "big", "--data", path, "--metadata", str(metadata)),
                *("--project", "p", "--data-dir", root),
            ]
        )
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"wall": wall, "peak": peak} if code == 0 else {"error": f"exit {code}"}))


def _child(flag: str, path: str, preexec: Any = None) -> dict[str, Any]:
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(  # fixed argv: this file
        [sys.executable, __file__, flag, path],
        capture_output=True,
        env=env,
        preexec_fn=preexec,
        check=False,
    )
    lines = done.stdout.decode().strip().splitlines()
    if done.returncode == 0 and lines:
        result: dict[str, Any] = json.loads(lines[-1])
        return result
    tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
    return {"error": f"exit status {done.returncode}: {tail[0][:120]}"}


def _pandas(path: str, memory_mb: int | None) -> dict[str, Any]:
    """pandas in a fresh interpreter with the sandbox's allocator settings and, if given, its
    RLIMIT_DATA: what loading the same file takes, or that it cannot within the limit."""

    def limit() -> None:
        if memory_mb is not None:
            size = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_DATA, (size, size))

    return _child("--pandas-child", path, limit)


def _in_child(target: Any, *args: Any) -> Any:
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=target, args=(*args, send))
    child.start()
    send.close()
    try:
        result: Any = receive.recv()
    except EOFError:
        child.join()
        result = {"error": f"the process died (exit status {child.exitcode})"}
    child.join()
    return result


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _row(name: str, got: dict[str, Any]) -> str:
    if "error" in got:
        return f"  {name:<38} cannot: {got['error']}"
    extra = f", load {got['load']:.1f} s" if "load" in got else ""
    released = f", {got['released']}" if "released" in got else ""
    return f"  {name:<38} {got['wall']:7.1f} s{extra}, peak RSS {_gib(got['peak'])}{released}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000_000)
    parser.add_argument("--memory-mb", type=int, default=2048)
    parser.add_argument(
        "--no-unlimited-pandas",
        action="store_true",
        help="skip pandas without a memory limit (it needs several GiB)",
    )
    parser.add_argument("--pandas-child", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--register-child", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pandas_child:
        _pandas_child(args.pandas_child)
        return
    if args.register_child:
        _register_child(args.register_child)
        return
    workdir = Path(tempfile.mkdtemp(prefix="larger-than-memory-"))
    try:
        path = workdir / "big.parquet"
        started = time.perf_counter()
        generate(path, args.rows)
        made = time.perf_counter() - started
        in_memory = args.rows * 8 * 4  # the four columns as pandas holds them (int64, float64)
        print(
            f"{platform.node()}: {args.rows:,} rows, Parquet {_gib(path.stat().st_size)} "
            f"(written in {made:.0f} s); in pandas: {_gib(in_memory)}; "
            f"job memory limit {args.memory_mb} MiB"
        )
        print("registration (`safeaccess-server dataset add`, read a batch at a time):")
        print(_row("dataset add", _child("--register-child", str(path))), flush=True)
        print("sandbox (process backend, fork server, storage 'duckdb'):")
        got = _in_child(_sandbox_jobs, str(path), args.memory_mb)
        rows = got if isinstance(got, list) else [got]
        names = [
            "checked 2-way table (region x sex)",
            "grouped mean (income by region)",
            "summary of income by sex (2 columns)",
        ]
        for i, name in enumerate(names):
            print(_row(name, rows[i] if i < len(rows) else {"error": "not run"}), flush=True)
        print("pandas loading the same file (read_parquet), beside it:")
        print(
            _row(
                f"within {args.memory_mb} MiB (RLIMIT_DATA)",
                _pandas(str(path), args.memory_mb),
            ),
            flush=True,
        )
        if not args.no_unlimited_pandas:
            print(_row("without a limit", _pandas(str(path), None)), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
