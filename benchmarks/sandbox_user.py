"""The process sandbox as root and as an unprivileged service user, in one run (issue 43).

A server run as the unprivileged user docs/deploy.md prescribes used to fall back to warm
sandboxes (about 2 s per simple table, 8x slower than root). This runs the same jobs through
`ProcessBackend` (the default fork server) in a child process as root, then as `--user` (created
with useradd if missing), on one generated census of `--rows` people (a frequency table region x
sex), `--threads` jobs at a time, and prints jobs/s, the median job, the mode each used and the
ratio unprivileged / root (target: >= 0.8). It measures the sandbox, the part that differs
between the two users; `benchmarks/throughput.py` measures the whole centre as root.

    python benchmarks/sandbox_user.py [--rows 100000] [--jobs 64] [--threads 4] [--user NAME]

Run as root. An interpreter below a directory others cannot enter (a Python under /root) is
made reachable for the user in a private mount namespace of the child only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from census_centre import ANALYSIS
from safeaccess.client.analyses import to_body
from safeaccess.server.demo.data import census_metadata, generate_census

# The service user's helpers, shared with the tests (tests/service_user.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from service_user import as_user, system_user

CHILD = r"""
import json, statistics, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from safeaccess.sandbox.backend import Job
from safeaccess.sandbox.process import ProcessBackend

dataset, jobs, threads = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
spec = json.loads(Path(sys.argv[4]).read_text())
backend = ProcessBackend()
backend.check_available()
job = Job(job_id="b", analysis=spec["analysis"], metadata=spec["metadata"], dataset=dataset)
first = backend.run(job).output.values  # the template's start, not counted

def one(_):
    start = time.perf_counter()
    assert backend.run(job).output.values == first
    return time.perf_counter() - start

start = time.perf_counter()
with ThreadPoolExecutor(threads) as pool:
    times = list(pool.map(one, range(jobs)))
wall = time.perf_counter() - start
backend.close()
print(json.dumps({"mode": backend.mode, "reason": backend.mode_reason, "rate": jobs / wall,
                  "median": statistics.median(times)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--user", default="safeaccess-bench")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: it compares root with an unprivileged user")
    system_user(args.user)  # kept afterwards: the next run reuses it
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        dataset = work / "census.parquet"
        generate_census(args.rows).to_parquet(dataset)
        dataset.chmod(0o644)
        spec = work / "job.json"
        metadata = census_metadata().model_dump(mode="json")
        spec.write_text(
            json.dumps({"analysis": json.loads(to_body(ANALYSIS)), "metadata": metadata})
        )
        spec.chmod(0o644)
        argv = [sys.executable, "-I", "-c", CHILD, str(dataset), str(args.jobs), str(args.threads)]
        argv.append(str(spec))
        print(
            f"{args.jobs} frequency tables on {args.rows:,} rows, {args.threads} at a time, "
            f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}"
        )
        figures = {}
        for who, command in (("root", argv), (args.user, as_user(args.user, argv))):
            done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=tmp)
            if done.returncode != 0:
                raise SystemExit(f"[{who}] failed: {done.stderr[-2000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            figures[who] = result["rate"]
            print(
                f"[{who}] {result['mode']} ({result['reason']}): {result['rate']:.1f} jobs/s, "
                f"median job {result['median'] * 1000:.0f} ms"
            )
        ratio = figures[args.user] / figures["root"]
        print(f"unprivileged / root: {ratio:.2f}x (target: >= 0.8x)")


if __name__ == "__main__":
    main()
