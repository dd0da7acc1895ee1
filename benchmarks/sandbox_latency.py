"""Benchmark per-step sandbox latency: process and Docker backends, cold and warm, vs in-process.

For each backend prints the median and 95th-percentile wall time of
- an empty job (a `script` analysis whose code is `pass`), and
- a one-way frequency table on `--rows` rows (100 000 by default),
once with every job starting a fresh sandbox (cold) and once with a warm sandbox waiting (the
Docker warm pool, the process backend's warm sandbox per dataset). Between warm jobs the script
waits, untimed, until the replacement sandbox is ready, as it would be between a researcher's
steps. The in-process line runs the runner's own `run_request` in this process: the cost of the
analysis itself, without any isolation. "overhead" is the median minus the in-process median.

    python benchmarks/sandbox_latency.py [--repeat 20] [--rows 100000] [--backends process,docker]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from safeaccess.sandbox.backend import Job, Limits, RunnerRequest

METADATA = {
    "name": "bench",
    "columns": [
        {"name": "sex", "type": "categorical", "levels": ["F", "M"]},
        {"name": "region", "type": "categorical", "levels": ["N", "S", "E", "W"]},
        {"name": "income", "type": "continuous"},
    ],
}
CASES = {
    "empty job": {"kind": "script", "code": "pass"},
    "frequency table": {"kind": "frequency_table", "rows": ["region"]},
}
LIMITS = Limits()


def _dataset(path: Path, rows: int) -> None:
    rng = np.random.default_rng(1)
    pd.DataFrame(
        {
            "sex": rng.choice(["F", "M"], rows),
            "region": rng.choice(["N", "S", "E", "W"], rows),
            "income": rng.normal(30_000, 8_000, rows),
        }
    ).to_parquet(path)
    path.chmod(0o440)


def _stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def _measure(run: Callable[[], object], repeat: int, between: Callable[[], object]) -> list[float]:
    samples = []
    for _ in range(repeat):
        between()  # untimed: e.g. wait for the warm sandbox to be ready
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return samples


def _in_process(dataset: Path, analysis: dict[str, Any]) -> Callable[[], object]:
    from safeaccess.sandbox.runner import run_request

    request = RunnerRequest(analysis=analysis, metadata=METADATA, dataset_path=str(dataset))

    def run() -> None:
        response = run_request(request, str(dataset))
        assert response.ok, response.error

    return run


def _backends(names: list[str], image: str | None) -> dict[str, dict[str, Any]]:
    """name -> {"cold": backend, "warm": backend, "wait": callable(dataset)}."""
    made: dict[str, dict[str, Any]] = {}
    if "process" in names:
        from safeaccess.sandbox.process import ProcessBackend

        warm = ProcessBackend(LIMITS)
        warm.check_available()
        try:
            cold = ProcessBackend(LIMITS, warm_per_dataset=False)  # type: ignore[call-arg]
        except TypeError:
            cold = None
        made["process"] = {"cold": cold, "warm": warm, "wait": lambda d: time.sleep(1.5)}
    if "docker" in names:
        from safeaccess.sandbox.config import DockerOptions
        from safeaccess.sandbox.docker import DockerBackend, build_image, connect, engine_address

        if image is None:
            image = build_image(connect(engine_address(DockerOptions()))).image_id
        cold_d = DockerBackend(DockerOptions(image=image, pool_size=0), LIMITS)
        warm_d = DockerBackend(DockerOptions(image=image, pool_size=1), LIMITS)
        cold_d.check_available()
        made["docker"] = {
            "cold": cold_d,
            "warm": warm_d,
            "wait": lambda d: warm_d.wait_warm(d, LIMITS, timeout=120) and time.sleep(0.2),
        }
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--backends", default="process,docker")
    parser.add_argument("--image", default=None, help="Docker sandbox image id (default: build)")
    args = parser.parse_args()
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    print(f"python {platform.python_version()} on {platform.machine()}, repeat={args.repeat}")
    backends = _backends(names, args.image)
    rows: list[tuple[str, str, str, float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        empty, data = Path(tmp) / "empty.parquet", Path(tmp) / "data.parquet"
        _dataset(empty, 10)
        _dataset(data, args.rows)
        datasets = {"empty job": empty, "frequency table": data}
        baseline: dict[str, float] = {}
        for case, analysis in CASES.items():
            run = _in_process(datasets[case], analysis)
            run()  # imports, page cache
            median, p95 = _stats(_measure(run, args.repeat, lambda: None))
            baseline[case] = median
            rows.append(("in-process", case, "-", median, p95, 0.0))
        for name, made in backends.items():
            for mode in ("cold", "warm"):
                backend = made[mode]
                if backend is None:
                    continue
                for case, analysis in CASES.items():
                    dataset = datasets[case]
                    job = Job(job_id="b", analysis=analysis, metadata=METADATA, dataset=dataset)

                    def run(backend: Any = backend, job: Job = job) -> None:
                        backend.run(job)

                    wait: Callable[[], object] = (
                        (lambda d=dataset, w=made["wait"]: w(d)) if mode == "warm" else lambda: None
                    )
                    run()  # first job: page cache, and fills the warm sandbox
                    median, p95 = _stats(_measure(run, args.repeat, wait))
                    rows.append((name, case, mode, median, p95, median - baseline[case]))
        for made in backends.values():
            for mode in ("cold", "warm"):
                if made[mode] is not None:
                    made[mode].close()
    print(
        f"\n{'backend':<11}{'case':<18}{'mode':<6}{'median ms':>11}{'p95 ms':>10}{'overhead ms':>13}"
    )
    for name, case, mode, median, p95, overhead in rows:
        print(
            f"{name:<11}{case:<18}{mode:<6}{median * 1e3:>11.1f}{p95 * 1e3:>10.1f}"
            f"{overhead * 1e3:>13.1f}"
        )


if __name__ == "__main__":
    main()
