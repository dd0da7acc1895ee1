"""The full pipeline at census scale, over real HTTP with the process sandbox.

Generates census-like microdata (region 40 levels, age band 18, sex, ethnicity 5, health 5,
employment 3, income; a person number as record key) and measures, in one run:

- a checked frequency table (region x sex) end to end (signed request -> sandbox -> rules ->
  query-set audit -> one transaction -> response) against a bare `pd.crosstab` of the same two
  columns on the same data, both read from the stored Parquet file and already in memory
  (target: end to end within 3x of the bare crosstab);
- step 20 of a sequence against step 2 (target: within 20 %): 20 two-way tables, the auditor's
  state growing over the first four;
- database growth per step, at `--rows` and at `--small-rows` records (target: independent of the
  number of records; the auditor's state is a file beside the database, reported too);
- that a dataset of `--large-rows` records works (one checked table end to end).

    python benchmarks/scale.py [--rows 10000000] [--large-rows 20000000] [--small-rows 100000]
                               [--table-only]

`--table-only` stops after the first measurement (the checked table against bare `pd.crosstab`).

Peer: pandas itself (`pd.crosstab`), the figure a researcher with the data on her laptop gets.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.analyses import Analysis, FrequencyTable, to_body
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.server.config import DataDir, initialise
from safeaccess.server.datasets import register_dataset
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store import Store

REGIONS = [f"R{i:02d}" for i in range(40)]
AGE_BANDS = [f"{16 + 5 * i}-{20 + 5 * i}" for i in range(18)]
ETHNICITIES = ["A", "B", "C", "D", "E"]
EMPLOYMENT = ["employed", "unemployed", "inactive"]
TABLE = FrequencyTable(rows=["region"], cols=["sex"])
# A sequence of 20 tables cycling through four two-way tables: the auditor's state grows over the
# first four (4 320 atoms: region x sex x age band x employment) and stays the same after.
_CYCLE: list[Analysis] = [
    TABLE,
    FrequencyTable(rows=["age_band"], cols=["sex"]),
    FrequencyTable(rows=["employment"], cols=["sex"]),
    FrequencyTable(rows=["age_band"], cols=["employment"]),
]
SEQUENCE: list[Analysis] = [_CYCLE[i % len(_CYCLE)] for i in range(20)]


def census(rows: int, seed: int = 1) -> pd.DataFrame:
    """Census-like microdata, generated column by column (vectorised, a few seconds per 10 M)."""
    rng = np.random.default_rng(seed)

    def cat(levels: list[str], p: np.ndarray | None = None) -> pd.Categorical:
        codes = rng.choice(len(levels), rows, p=p).astype(np.int8)
        return pd.Categorical.from_codes(codes, categories=levels)

    weights = rng.uniform(0.5, 2.0, len(REGIONS))
    age_codes = rng.choice(len(AGE_BANDS), rows).astype(np.int8)
    employment = cat(EMPLOYMENT, np.array([0.6, 0.05, 0.35]))
    income = rng.lognormal(10.0, 0.6, rows) * (1.0 + 0.02 * age_codes)
    income[np.asarray(employment.codes) != 0] *= 0.3
    return pd.DataFrame(
        {
            "person_id": np.arange(1, rows + 1, dtype=np.int64),
            "region": cat(REGIONS, weights / weights.sum()),
            "age_band": pd.Categorical.from_codes(age_codes, categories=AGE_BANDS),
            "sex": cat(["F", "M"]),
            "ethnicity": cat(ETHNICITIES, np.array([0.8, 0.08, 0.06, 0.04, 0.02])),
            "health": rng.integers(1, 6, rows).astype(np.int8),
            "employment": employment,
            "income": np.minimum(np.round(income, 2), 2_000_000.0),
        }
    )


def metadata(name: str) -> DatasetMetadata:
    return DatasetMetadata(
        name=name,
        record_key="person_id",
        columns=[
            Column(name="person_id", type="identifier"),
            Column(name="region", type="categorical", levels=list(REGIONS)),
            Column(name="age_band", type="ordinal", levels=list(AGE_BANDS)),
            Column(name="sex", type="categorical", levels=["F", "M"]),
            Column(name="ethnicity", type="categorical", levels=list(ETHNICITIES)),
            Column(name="health", type="ordinal", levels=[1, 2, 3, 4, 5], scale=(1, 5)),
            Column(name="employment", type="categorical", levels=list(EMPLOYMENT)),
            Column(name="income", type="continuous", bounds=(0, 2_000_000)),
        ],
    )


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())


def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


class Bench:
    def __init__(self, root: Path):
        config = initialise(root, server_id="bench")
        self.root = root
        self.data = DataDir(root)
        self.key = Ed25519PrivateKey.generate()
        store = Store(self.data.database_url(config))
        try:
            store.add_project("bench")
            pub = self.key.public_key()
            store.add_researcher("r0", public_key_text(pub), fingerprint(pub), ["bench"])
        finally:
            store.close()
        # The process sandbox's default memory limit is sized for ordinary jobs; at 20 M records
        # the runner holds two columns, the codes and the 80 MB query-set array.
        config = self.data.load_config()
        limits = config.sandbox.limits.model_copy(
            update={"memory_mb": 8192, "cpu_seconds": 600, "wall_seconds": 600.0}
        )
        sandbox = config.sandbox.model_copy(update={"limits": limits})
        self.data.save_config(config.model_copy(update={"sandbox": sandbox}))

    def register(self, name: str, frame: pd.DataFrame) -> float:
        store = Store(self.data.database_url(self.data.load_config()))
        start = time.perf_counter()
        try:
            register_dataset(
                self.data, store, name=name, frame=frame, metadata=metadata(name), project="bench"
            )
        finally:
            store.close()
        return time.perf_counter() - start

    def sequence(
        self, url: str, server_id: str, dataset: str, analyses: list[Analysis]
    ) -> tuple[list[float], list[str], list[int]]:
        """Run one sequence step by step: wall time, status and database size after each."""
        sealed = seal(
            [to_body(a) for a in analyses],
            self.key,
            researcher="r0",
            project="bench",
            dataset=dataset,
            server=server_id,
        )
        db = self.root / "safeaccess.db"
        times, statuses, sizes = [], [], []
        with connect(url, self.key, "r0") as session:
            start = time.perf_counter()
            result = session.open(sealed)
            times.append(time.perf_counter() - start)
            statuses.append(result.status)
            sizes.append(_size(db))
            for j in range(2, len(analyses) + 1):
                if not result.released:
                    break
                start = time.perf_counter()
                result = session.reveal(result.sequence_id, sealed, j)
                times.append(time.perf_counter() - start)
                statuses.append(result.status)
                sizes.append(_size(db))
        return times, statuses, sizes


def bare_crosstab(path: Path, repeats: int = 3) -> tuple[float, float]:
    """Median seconds of pd.crosstab(region, sex): read from Parquet and crosstab; in memory."""
    read_and_tab, in_memory = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        frame = pd.read_parquet(path, columns=["region", "sex"])
        middle = time.perf_counter()
        pd.crosstab(frame["region"], frame["sex"])
        end = time.perf_counter()
        read_and_tab.append(end - start)
        in_memory.append(end - middle)
    return statistics.median(read_and_tab), statistics.median(in_memory)


def in_process(path: Path, repeats: int = 3) -> float:
    """Median seconds of the sandbox's own work for TABLE on the stored data in memory: the
    table with its facts and query set (`frequency_table`) and the checks; no process, no I/O."""
    from safeaccess.rules.engine import check
    from safeaccess.sandbox.runner.compute.tables import frequency_table

    frame = pd.read_parquet(path, columns=["region", "sex"])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        check(frequency_table(TABLE, frame, metadata("census"), len(frame)))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--large-rows", type=int, default=20_000_000)
    parser.add_argument("--small-rows", type=int, default=100_000)
    parser.add_argument(
        "--table-only", action="store_true", help="only the checked table against pd.crosstab"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp) / "data")
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python "
            f"{platform.python_version()}"
        )
        start = time.perf_counter()
        frame = census(args.rows)
        print(f"generated {args.rows:,} rows in {time.perf_counter() - start:.1f} s")
        print(f"registered in {bench.register('census', frame):.1f} s")
        del frame
        bench.register("small", census(args.small_rows, seed=2))
        service = Service(bench.root)
        with service, EmbeddedServer(create_app(service)) as server:
            print(f"sandbox backend: {service.backend.name}")
            url, sid = server.url, service.server_id
            # Warm-up (imports, page cache), not counted.
            bench.sequence(url, sid, "small", [TABLE])

            single = [bench.sequence(url, sid, "census", [TABLE])[0][0] for _ in range(3)]
            stored = bench.root / "datasets" / "census" / "v1.parquet"
            read_tab, mem_tab = bare_crosstab(stored)
            end_to_end = statistics.median(single)
            print(f"\nfrequency table region x sex on {args.rows:,} rows")
            print(f"  checked, end to end over HTTP: median {end_to_end:.2f} s (3 runs)")
            print(f"  bare pd.crosstab, read 2 columns from Parquet + crosstab: {read_tab:.2f} s")
            print(f"  bare pd.crosstab on data in memory: {mem_tab:.2f} s")
            print(
                f"  ratio end to end / bare: {end_to_end / read_tab:.1f}x (read + crosstab), "
                f"{end_to_end / mem_tab:.1f}x (in memory); target 3x"
            )
            print(f"  runs: {', '.join(f'{t:.3f}' for t in single)} s")
            print(f"  the table and its checks alone, in process: {in_process(stored):.3f} s")
            if args.table_only:
                return

            times, statuses, sizes = bench.sequence(url, sid, "census", SEQUENCE)
            print(f"\nsequence of {len(SEQUENCE)} two-way tables on {args.rows:,} rows")
            print(f"  statuses: {statuses}")
            if len(times) >= 20:
                print(
                    f"  step 2: {times[1]:.2f} s, step 20: {times[19]:.2f} s, ratio "
                    f"{times[19] / times[1]:.2f} (target within 1.20)"
                )
            growth = [b - a for a, b in itertools.pairwise(sizes)]
            print(
                f"  database growth per step: median {statistics.median(growth) / 1024:.1f} KiB "
                f"(steps 2..{len(sizes)})"
            )
            _small_times, small_statuses, small_sizes = bench.sequence(url, sid, "small", SEQUENCE)
            small_growth = [b - a for a, b in itertools.pairwise(small_sizes)]
            print(
                f"  at {args.small_rows:,} rows: median {statistics.median(small_growth) / 1024:.1f}"
                f" KiB per step ({len(small_statuses)} steps)"
            )
            print(
                f"  auditor state files: {_tree_size(bench.root / 'qss') / 2**20:.0f} MiB in all "
                "(newest three per scope kept)"
            )
        if args.large_rows:
            start = time.perf_counter()
            frame = census(args.large_rows, seed=3)
            print(f"\ngenerated {args.large_rows:,} rows in {time.perf_counter() - start:.1f} s")
            print(f"registered in {bench.register('large', frame):.1f} s")
            del frame
            service = Service(bench.root)
            with service, EmbeddedServer(create_app(service)) as server:
                times, statuses, _ = bench.sequence(server.url, service.server_id, "large", [TABLE])
                print(
                    f"frequency table on {args.large_rows:,} rows: {statuses[0]} in "
                    f"{times[0]:.2f} s end to end"
                )


if __name__ == "__main__":
    main()
