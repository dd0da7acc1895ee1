"""The job queue's cost and throughput: one API replica on PostgreSQL running its steps itself
("local"), against the same replica deferring them to 1 and then 2 `safeaccess-server worker`
processes ("queue"), all in one run on one machine, so machine noise cancels.

1. latency of a table step, one researcher revealing one step at a time (median of
   `--sequential` steps): local against queue; the difference is what the queue adds per step
   (defer in the step's transaction, a worker's claim and its read of the step, the settle's
   NOTIFY, which carries the step's view to the waiting replica; target <= 5 ms). The machine's
   load average is printed before and after: on a shared machine the figure moves with it;
2. throughput, `--researchers` researchers x `--steps-each` steps at once, with 1 and 2 workers
   (`--slots` each) and local; the ratio 2 workers / 1 worker (on one 2-core machine the
   workers share the cores with the replica and the clients: the ratio shows the queue does not
   serialise them, not a second machine's gain);
3. the claim rate of the queue alone: `--claims` no-op jobs deferred, then claimed and finished
   by one procrastinate worker (`--claim-concurrency`), jobs per second.

    python benchmarks/cluster.py [--rows 100000] [--researchers 8] [--steps-each 4]

Needs PostgreSQL's server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql, and
root for the process sandbox's fresh uids, like throughput.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import create_engine, make_url, text

from census_centre import ANALYSIS, percentile, prepare, run_concurrently, run_sequence
from safeaccess.client.analyses import to_body
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.server.config import DataDir
from safeaccess.server.demo.data import generate_census
from safeaccess.server.store.settled import conninfo

# The throwaway PostgreSQL cluster of the tests (initdb in a temp dir, a Unix socket).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from pg_throwaway import ThrowawayPostgres, free_port

CLI = [sys.executable, "-m", "safeaccess.server.admin.cli"]


def _set_execution(root: Path, execution: str) -> None:
    path = DataDir(root).config_path
    config = yaml.safe_load(path.read_text())
    config["execution"] = execution
    path.write_text(yaml.safe_dump(config))


@contextmanager
def _process(command: list[str], ready: str | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A child process, stopped with SIGTERM afterwards; with `ready`, once it prints it."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        if ready is not None:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if ready.encode() not in line:
                raise RuntimeError(f"{command[3]} did not start: {line!r}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def _replica(root: Path) -> Iterator[str]:
    port = free_port()
    with _process([*CLI, "serve", "--data-dir", str(root), "--port", str(port)]):
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not start")
            time.sleep(0.1)
        yield url


@contextmanager
def _workers(root: Path, count: int, slots: int, first: int = 0) -> Iterator[None]:
    """`count` worker processes with `slots` slots each, ready."""
    with ExitStack() as stack:
        for i in range(first, first + count):
            stack.enter_context(
                _process(
                    [
                        *CLI,
                        "worker",
                        "--data-dir",
                        str(root),
                        "--slots",
                        str(slots),
                        "--name",
                        f"bench{i}",
                    ],
                    ready="ready",
                )
            )
        yield


def _interleaved(
    centres: dict[str, tuple[str, dict[str, Ed25519PrivateKey]]], steps: int
) -> dict[str, list[float]]:
    """Latency of each step of one researcher's sequence on every centre, the centres taking
    turns step by step (so a busy moment of the machine falls on all of them); a first short
    sequence on each warms its sandbox templates and is not counted."""
    name = "r0"
    body = to_body(ANALYSIS)
    for url, keys in centres.values():
        run_sequence(url, name, keys[name], 2, "bench")
    sealed = {
        label: seal(
            [body] * steps,
            keys[name],
            researcher=name,
            project="bench",
            dataset="census",
            server="bench",
        )
        for label, (_, keys) in centres.items()
    }
    times: dict[str, list[float]] = {label: [] for label in centres}
    sessions = {label: connect(url, keys[name], name) for label, (url, keys) in centres.items()}
    try:
        ids: dict[str, str] = {}
        for index in range(1, steps + 1):
            for label, session in sessions.items():
                start = time.perf_counter()
                if index == 1:
                    result = session.open(sealed[label])
                    ids[label] = result.sequence_id
                else:
                    result = session.reveal(ids[label], sealed[label], index)
                times[label].append(time.perf_counter() - start)
                assert result.released, result.describe()
    finally:
        for session in sessions.values():
            session.close()
    return times


def _concurrent(url: str, keys: dict[str, Ed25519PrivateKey], steps: int) -> tuple[float, float]:
    """(steps/s, p95 latency) for every researcher revealing `steps` steps at once."""
    latencies, wall = run_concurrently(url, keys, steps, "bench")
    return len(latencies) / wall, percentile(latencies, 0.95)


def _claim_rate(url: str, jobs: int, concurrency: int) -> float:
    """Jobs per second the queue alone claims and finishes (a no-op task)."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo(url)))

    @app.task(name="bench.noop", queue="bench")
    def noop(i: int) -> None:
        return None

    async def run() -> float:
        async with app.open_async():
            await noop.batch_defer_async(*({"i": i} for i in range(jobs)))
            start = time.perf_counter()
            await app.run_worker_async(
                queues=["bench"],
                concurrency=concurrency,
                wait=False,
                install_signal_handlers=False,
                delete_jobs="successful",
            )
            return jobs / (time.perf_counter() - start)

    return asyncio.run(run())


def _centre(
    postgres: ThrowawayPostgres,
    folder: Path,
    name: str,
    rows: int,
    researchers: int,
    execution: str,
) -> tuple[Path, dict[str, Ed25519PrivateKey], str]:
    """A centre in `folder/name` on its own database; (data dir, keys, database URL)."""
    admin = create_engine(postgres.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(postgres.url).set(database=name).render_as_string(False)
    root = folder / name
    keys = prepare(root, generate_census(rows, seed=3), researchers, url)
    _set_execution(root, execution)
    return root, keys, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--researchers", type=int, default=8)
    parser.add_argument("--steps-each", type=int, default=4)
    parser.add_argument("--sequential", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="throughput runs per set-up")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument(
        "--latency-only", action="store_true", help="only part 1, the per-step overhead"
    )
    args = parser.parse_args()
    print(
        f"machine: {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}; {args.rows} rows, {args.researchers} researchers x "
        f"{args.steps_each} steps; load average {os.getloadavg()[0]:.1f}"
    )
    postgres = ThrowawayPostgres()
    postgres.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            local, keys, _ = _centre(
                postgres, folder, "local", args.rows, args.researchers, "local"
            )
            queue, qkeys, qurl = _centre(
                postgres, folder, "queue", args.rows, args.researchers, "queue"
            )
            with ExitStack() as stack:
                local_api = stack.enter_context(_replica(local))
                stack.enter_context(_workers(queue, 1, args.slots, first=0))
                queue_api = stack.enter_context(_replica(queue))
                lat = _interleaved(
                    {"local": (local_api, keys), "queue": (queue_api, qkeys)}, args.sequential
                )
                median = {k: statistics.median(v) * 1000 for k, v in lat.items()}
                # Each queue step right after the same step on the local centre: the median of
                # those differences cancels the machine's load drifting during the run.
                paired = statistics.median(
                    (q - lo) * 1000 for lo, q in zip(lat["local"], lat["queue"], strict=True)
                )
                print(
                    f"one step at a time, {args.sequential} steps, taking turns: local median "
                    f"{median['local']:.1f} ms, queue median {median['queue']:.1f} ms: the queue "
                    f"adds {median['queue'] - median['local']:+.1f} ms per step; median of the "
                    f"paired differences {paired:+.1f} ms (target <= 5); load average now "
                    f"{os.getloadavg()[0]:.1f}"
                )
                if args.latency_only:
                    return
                rates: dict[str, list[float]] = {
                    "local": [],
                    "queue, 1 worker": [],
                    "queue, 2 workers": [],
                }
                p95s: dict[str, list[float]] = {k: [] for k in rates}

                def measure(label: str, url: str, which: dict[str, Ed25519PrivateKey]) -> None:
                    rate, p95 = _concurrent(url, which, args.steps_each)
                    rates[label].append(rate)
                    p95s[label].append(p95)

                for _ in range(args.rounds):
                    measure("local", local_api, keys)
                    measure("queue, 1 worker", queue_api, qkeys)
                stack.enter_context(_workers(queue, 1, args.slots, first=1))
                _concurrent(queue_api, qkeys, 2)  # not counted: the new worker's templates start
                for _ in range(args.rounds):
                    measure("local", local_api, keys)
                    measure("queue, 2 workers", queue_api, qkeys)
            for label, values in rates.items():
                print(
                    f"{label:17s} {args.researchers}x{args.steps_each} at once: "
                    f"median {statistics.median(values):.1f} steps/s "
                    f"(runs: {', '.join(f'{v:.1f}' for v in values)}), "
                    f"p95 median {statistics.median(p95s[label]) * 1000:.0f} ms"
                )
            one, two = (
                statistics.median(rates[k]) for k in ("queue, 1 worker", "queue, 2 workers")
            )
            print(
                f"throughput 2 workers / 1 worker: {two / one:.2f}x (one 2-core machine: the "
                "workers share its cores with the replica and the clients)"
            )
            for concurrency in (1, 4):
                rate = _claim_rate(qurl, args.claims, concurrency)
                print(
                    f"claim rate of the queue alone: {rate:.0f} jobs/s ({args.claims} no-op "
                    f"jobs, concurrency {concurrency})"
                )
    finally:
        postgres.remove()


if __name__ == "__main__":
    main()
