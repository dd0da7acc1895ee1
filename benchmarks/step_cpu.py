"""Server CPU and SQL statements per table step, in one process, with an optional profile.

Runs `--rounds` rounds in which each of `--researchers` researchers (one project, so one
query-set scope, as in `throughput.py`) reveals a sequence of `--steps-each` frequency tables
(region x sex) on a generated census of `--rows` people, straight through `Service` (the HTTP layer's own parsing of the
request model included, the signature check and the socket not), one step after another on
this thread. The sandbox is the configured backend (the process backend's fork server by
default) and runs in other processes, so this thread's CPU time is the server's own work:
verification, the admission, the transaction(s), the audit records, the view and receipt.

Prints the median and p90 thread-CPU per step and the SQL statements per step (opening step
and later reveals apart), counted by an SQLAlchemy `before_cursor_execute` listener;
`--profile N` prints the N heaviest functions (cumulative, then own time) of a cProfile of this
thread's CPU time over all steps.

    python benchmarks/step_cpu.py [--rows 100000] [--researchers 8] [--rounds 2] [--steps-each 4] [--profile 40]
        [--profile-dump FILE]
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event

from census_centre import ANALYSIS, percentile, prepare
from safeaccess.client.analyses import to_body
from safeaccess.client.protocol import seal
from safeaccess.server.demo.data import generate_census
from safeaccess.server.heap import freeze_startup_objects
from safeaccess.server.schemas import OpenRequest, RevealRequest
from safeaccess.server.service import Service


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _timed(counter: list[int], call: Callable[[], Any]) -> tuple[Any, float, int]:
    """(result, this thread's CPU seconds, SQL statements) of `call`."""
    before = counter[0]
    start = time.thread_time()
    result = call()
    return result, time.thread_time() - start, counter[0] - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--researchers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps-each", type=int, default=4)
    parser.add_argument("--profile", type=int, default=0, help="print the N heaviest functions")
    parser.add_argument("--profile-dump", help="also write the profile to this file (pstats)")
    args = parser.parse_args()

    frame = generate_census(args.rows)
    body = to_body(ANALYSIS)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        keys = prepare(root, frame, args.researchers)
        with Service(root) as service:
            freeze_startup_objects()  # as `safeaccess-server serve` does
            counter = [0]

            def count(*_args: Any) -> None:
                counter[0] += 1

            event.listen(service.store.engine, "before_cursor_execute", count)
            # The first sequence starts the template and warms the caches: not counted.
            sealed_all = [
                (
                    name,
                    seal(
                        [body] * args.steps_each,
                        keys[name],
                        researcher=name,
                        project="bench",
                        dataset="census",
                        server=service.server_id,
                    ),
                )
                for name in ["r0"] + list(keys) * args.rounds
            ]
            opens: list[tuple[float, int]] = []
            reveals: list[tuple[float, int]] = []
            # This thread's CPU time, as the figures: waiting for the sandbox costs nothing.
            profiler = cProfile.Profile(time.thread_time) if args.profile else None
            for n, (name, sealed) in enumerate(sealed_all):
                warm = n == 0
                trace, step_body = sealed.reveal_for(1)
                raw = json.dumps(
                    {
                        "header": _b64(sealed.header),
                        "signature": _b64(sealed.signature),
                        "endorsements": [],
                        "trace": trace.hex(),
                        "body": _b64(step_body),
                    }
                )
                if profiler is not None and not warm:
                    profiler.enable()
                view, cpu, statements = _timed(
                    counter,
                    lambda raw=raw, name=name: service.open_sequence(  # type: ignore[misc]
                        name, OpenRequest.model_validate_json(raw)
                    ),
                )
                if not warm:
                    opens.append((cpu, statements))
                assert view.state == "released", view
                for j in range(2, args.steps_each + 1):
                    trace, step_body = sealed.reveal_for(j)
                    raw = json.dumps({"trace": trace.hex(), "body": _b64(step_body)})
                    view, cpu, statements = _timed(
                        counter,
                        lambda raw=raw, j=j, sid=view.sequence_id, name=name: service.flow.reveal(  # type: ignore[misc]
                            name, sid, j, RevealRequest.model_validate_json(raw)
                        ),
                    )
                    assert view.state == "released", view
                    if not warm:
                        reveals.append((cpu, statements))
                if profiler is not None:
                    profiler.disable()
            event.remove(service.store.engine, "before_cursor_execute", count)

    every = [c for c, _ in opens + reveals]
    print(
        f"{len(every)} steps ({len(opens)} opening, {len(reveals)} reveals), {args.rows:,} rows; "
        f"server thread CPU per step: median {statistics.median(every) * 1000:.2f} ms, p90 "
        f"{percentile(every, 0.9) * 1000:.2f} ms"
    )
    for label, rows in (("opening step", opens), ("later reveal", reveals)):
        if rows:
            cpus = [c for c, _ in rows]
            counts = sorted({s for _, s in rows})
            print(
                f"  {label}: CPU median {statistics.median(cpus) * 1000:.2f} ms; "
                f"SQL statements {counts}"
            )
    if profiler is not None:
        stats = pstats.Stats(profiler)
        if args.profile_dump:
            stats.dump_stats(args.profile_dump)
        stats.sort_stats("cumulative").print_stats(args.profile)
        stats.sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
