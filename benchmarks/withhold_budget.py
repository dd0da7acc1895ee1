"""The withhold budget's read, on every step's view, against a researcher's history.

In one process, on the embedded SQLite: a store migrated to the newest schema, one researcher
with `--sequences` sequences of `--steps` steps on one dataset (every tenth aborted on a withheld
last step, spread over the last year: a heavy user), and another researcher with as many. Times
`Store.withholds_since` (the count of her withholds in the last 30 days and of her open
sequences) with the schema's (researcher, state) index (migration 0007), then with that index
dropped: the median of `--repeat` reads each, and the ratio. The read goes through her aborted
and open sequences, so it grows with those, never with other researchers' rows.

    python benchmarks/withhold_budget.py [--sequences 6000] [--steps 5] [--repeat 50]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert, text

from safeaccess.server.store import Store, catalogue, review
from safeaccess.server.store.schema import SequenceRow, StepRow

NOW = datetime.now(UTC)


def _fill(store: Store, researcher: str, sequences: int, steps: int) -> None:
    seqs: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for n in range(sequences):
        seq_id = f"{researcher[0]}{n:031d}"
        aborted = n % 10 == 9
        at = NOW - timedelta(days=365 * n / sequences)
        seqs.append(
            {
                "id": seq_id,
                "researcher": researcher,
                "project": "p",
                "dataset_id": 1,
                "header": b"h",
                "header_hash": f"{seq_id}{'0' * 32}",
                "nonce": seq_id,
                "signature": b"s",
                "endorsements": [],
                "state": "aborted" if aborted else "finished",
                "current_index": steps,
                "verifier_state": {},
                "version": steps,
                "created_at": at,
                "updated_at": at,
            }
        )
        for i in range(1, steps + 1):
            withheld = aborted and i == steps
            rows.append(
                {
                    "sequence_id": seq_id,
                    "index": i,
                    "trace_hash": "t",
                    "body": b"b",
                    "body_hash": "bh",
                    "last": i == steps,
                    "state": "withheld" if withheld else "released",
                    "created_at": at,
                    "updated_at": at,
                }
            )
    with store.engine.begin() as conn:
        conn.execute(insert(SequenceRow), seqs)
        conn.execute(insert(StepRow), rows)


def _median_ms(store: Store, repeat: int) -> tuple[float, tuple[int, int]]:
    since = NOW - timedelta(days=30)
    found = review.withholds_since(store, "ada", "census", since)  # warm
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        review.withholds_since(store, "ada", "census", since)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=6000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'db.sqlite'}")
        store.add_project("p")
        for name in ("ada", "bob"):
            store.add_researcher(name, "PEM", f"fp-{name}", ["p"])
        catalogue.add_dataset(
            store,
            name="census",
            version=1,
            project="p",
            path="census.parquet",
            sha256="0" * 64,
            rows=10,
            metadata={"name": "census"},
            rules_path=None,
        )
        for name in ("ada", "bob"):
            _fill(store, name, args.sequences, args.steps)
        print(
            f"two researchers with {args.sequences:,} sequences of {args.steps} steps each "
            f"({2 * args.sequences * args.steps:,} steps), SQLite"
        )
        indexed, found = _median_ms(store, args.repeat)
        print(f"with the budget's index: median {indexed:.3f} ms (withheld, open = {found})")
        with store.engine.begin() as conn:
            conn.execute(text("DROP INDEX ix_sequences_researcher_state"))
        before, found_before = _median_ms(store, args.repeat)
        assert found_before == found
        print(f"without it: median {before:.3f} ms")
        print(f"ratio: {before / indexed:.0f}x less per step's view")
        store.close()


if __name__ == "__main__":
    main()
