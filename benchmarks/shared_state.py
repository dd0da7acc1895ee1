"""Benchmark what sharing state between replicas costs per request: review sessions and
authentication-failure counts in the database, against the in-process versions they replaced,
and (PostgreSQL) taking and releasing a scope's advisory lock.

For each operation, the median and p95 of `--n` calls, one after another:

- `session get`: a page request's session lookup (one UPDATE of `seen_at`, one read);
- `session new`: a new anonymous session (one INSERT);
- `api retry_after`: the check every signed request makes before its signature (two reads);
- `login retry_after`: the check of a login (one read);
- `memory retry_after`: the in-process API limiter, for comparison;
- `advisory lock`: acquire + release of a scope's shared lock (PostgreSQL only).

    python benchmarks/shared_state.py [--n 500] [--postgres-url postgresql+psycopg://...]

Without `--postgres-url` only SQLite (a file in a temporary directory, WAL, synchronous=FULL)
is measured.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from safeaccess.server.ratelimit import DatabaseFailureLimiter, MemoryFailureLimiter
from safeaccess.server.store import Store
from safeaccess.server.store.advisory_locks import SharedLocks
from safeaccess.server.web.ratelimit import FailureLimiter
from safeaccess.server.web.sessions import SessionStore


def _time(call: Callable[[], object], n: int) -> tuple[float, float]:
    """(median, p95) of n calls, in milliseconds."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


def measure(url: str, n: int) -> dict[str, tuple[float, float]]:
    store = Store(url)
    try:
        sessions = SessionStore(store, idle_seconds=900, absolute_seconds=28800)
        session = sessions.new("olivia")
        api = DatabaseFailureLimiter(store)
        login = FailureLimiter(store, "login-account", 5, 900)
        for i in range(50):  # some rows to find among
            api.failed(f"key{i}", f"10.0.0.{i}")
        results = {
            "session get": _time(lambda: sessions.get(session.id), n),
            "session new": _time(sessions.new, n),
            "api retry_after": _time(lambda: api.retry_after("key7", "10.0.0.7"), n),
            "login retry_after": _time(lambda: login.retry_after("acct:olivia"), n),
            "memory retry_after": _time(
                lambda: MemoryFailureLimiter().retry_after("key7", "10.0.0.7"), n
            ),
        }
        if store.engine.dialect.name == "postgresql":
            locks = SharedLocks(store.engine, "qss-scope", 10.0)

            def lock_once() -> None:
                lock = locks.lock("census/project/p1")
                lock.acquire()
                lock.release()

            results["advisory lock"] = _time(lock_once, n)
        return results
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--postgres-url", default=None, help="an empty PostgreSQL database")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        targets = {"sqlite": f"sqlite:///{Path(tmp) / 'bench.db'}"}
        if args.postgres_url:
            targets["postgresql"] = args.postgres_url
        for name, url in targets.items():
            print(f"{name}: median / p95 of {args.n} calls (ms)")
            for operation, (median, p95) in measure(url, args.n).items():
                print(f"  {operation:20} {median:8.3f} / {p95:8.3f}")


if __name__ == "__main__":
    main()
