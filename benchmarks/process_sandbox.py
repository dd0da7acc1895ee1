"""Benchmark the process (bubblewrap) sandbox backend: per-job overhead and typical analyses.

Prints the median and 90th-percentile wall time of:
- the bare sandbox (bwrap + `python -c pass`, no runner),
- the runner outside any sandbox (python -m safeaccess.sandbox.runner; imports + parquet read),
- a trivial job through ProcessBackend (frequency table on a small dataset), cold (no warm
  sandbox) and warm (1.5 s between jobs, so the sandbox pre-started after the previous job has
  finished importing its libraries),
- a summary, an OLS regression (pays for importing statsmodels) and a script on `--rows` rows.

    python benchmarks/process_sandbox.py [--repeat 15] [--rows 100000]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from safeaccess.sandbox.backend import Job, Limits, RunnerRequest
from safeaccess.sandbox.process.backend import ProcessBackend, _next_uid
from safeaccess.sandbox.process.bwrap import rlimits as _rlimits

METADATA = {
    "name": "bench",
    "columns": [
        {"name": "sex", "type": "categorical", "levels": ["F", "M"]},
        {"name": "region", "type": "categorical"},
        {"name": "age", "type": "integer", "bounds": [0, 120]},
        {"name": "income", "type": "continuous"},
    ],
}


def _dataset(path: Path, rows: int) -> None:
    rng = np.random.default_rng(1)
    pd.DataFrame(
        {
            "sex": rng.choice(["F", "M"], rows),
            "region": rng.choice(["N", "S", "E", "W"], rows),
            "age": rng.integers(18, 90, rows),
            "income": rng.normal(30_000, 8_000, rows),
        }
    ).to_parquet(path)


def _times(run: Callable[[], object], repeat: int, pause: float = 0.0) -> tuple[float, float]:
    run()  # warm the page cache
    samples = []
    for _ in range(repeat):
        time.sleep(pause)  # not timed: lets a warm sandbox finish its imports
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    backend = ProcessBackend(Limits())
    backend.check_available()
    cold_backend = ProcessBackend(Limits(), warm_per_dataset=False)
    print(f"python {platform.python_version()} on {platform.machine()}, repeat={args.repeat}")
    with tempfile.TemporaryDirectory() as tmp:
        small, large = Path(tmp) / "small.parquet", Path(tmp) / "large.parquet"
        _dataset(small, 200)
        _dataset(large, args.rows)

        bare = backend.command(small, backend.limits, _next_uid() if backend.as_root else None)
        bare = [*bare[: bare.index("--") + 1], sys.executable, "-I", "-c", "pass"]
        rlimits = _rlimits(backend.limits, backend.limits.max_processes)

        def run_bare() -> None:
            subprocess.run(bare, check=True, preexec_fn=rlimits)

        request = RunnerRequest(
            analysis={"kind": "frequency_table", "rows": ["sex"]},
            metadata=METADATA,
            dataset_path=str(small),
        ).model_dump_json()

        def run_unsandboxed() -> None:
            subprocess.run(
                [sys.executable, "-m", "safeaccess.sandbox.runner"],
                input=request.encode(),
                capture_output=True,
                check=True,
            )

        def job(
            analysis: dict, dataset: Path, use: ProcessBackend = backend
        ) -> Callable[[], object]:
            return lambda: use.run(
                Job(job_id="bench", analysis=analysis, metadata=METADATA, dataset=dataset)
            )

        trivial = {"kind": "frequency_table", "rows": ["sex"]}

        cases: list[tuple[str, Callable[[], object], float]] = [
            ("bare sandbox (bwrap + python -c pass)", run_bare, 0.0),
            ("runner without sandbox (200 rows)", run_unsandboxed, 0.0),
            ("trivial job, cold sandbox", job(trivial, small, cold_backend), 0.0),
            ("trivial job, warm sandbox (1.5 s apart)", job(trivial, small), 1.5),
            ("trivial job, back-to-back (warm not ready)", job(trivial, small), 0.0),
        ]
        big: list[tuple[str, dict]] = [
            (
                "two-way table + margins",
                {"kind": "frequency_table", "rows": ["sex"], "cols": ["region"], "margins": True},
            ),
            (
                "summary by region",
                {
                    "kind": "summary",
                    "variables": ["income", "age"],
                    "by": ["region"],
                    "statistics": ["count", "mean", "sd", "median"],
                },
            ),
            (
                "OLS income ~ age + C(sex)",
                {"kind": "regression", "formula": "income ~ age + C(sex)"},
            ),
            ("script", {"kind": "script", "code": "print(df.income.mean())"}),
        ]
        for name, analysis in big:
            cases.append((f"{name}, {args.rows} rows, warm", job(analysis, large), 1.5))
        for name, run, pause in cases:
            median, p90 = _times(run, args.repeat, pause)
            print(f"{name:52s} median {median * 1000:8.1f} ms   p90 {p90 * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
