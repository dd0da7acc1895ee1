"""The query-set auditor on ordinary research: what it releases, and what each admission costs.

Three workloads, each admitted one output at a time into one shared (project) scope, with the
universe admitted first, as the server does:

- `marginals`: the four marginal tables of issue 20 (region; sex × age band; ethnicity ×
  employment; health), at 100 000 and at 10 M records: all four must be released.
- `corpus`: six researchers' ordinary research on 200 000 records: overlapping two-way tables,
  histograms with declared bin edges (overall and by group), grouped summaries and regressions
  with their dummy groups, some restricted by a filter. Every output must be released.
- `cost`: the corpus repeated on fresh filters until about 1 000 query sets are admitted, then
  the admit time at that size (the issue's target: median ≤ 50 ms at 200 000 records).

Prints, per workload: released / total, atoms, atoms below k, rank (independent rows), the
certificate's size (completing sets, atoms in them, quotient dimension), admit wall/CPU median
and p95, the encoded state's growth per release and the size of a release's delta (the file
the server writes for an admitted step between full states: its arrays and the small rest).

`statefiles` (not run by default) admits the marginals at `--big-records` into one scope through
the server's state files and prints each save's time (what a step waits for), the background
full writes' and cold loads' (from a full file, with one delta, and the deepest chain).

Run: python benchmarks/qss.py [--workloads marginals,corpus,cost,statefiles]
     [--big-records 10000000] [--sets 1000] [--state-steps 16] [--verbose]

Wall times on a shared machine depend on its load; CPU times (process time) much less so.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from safeaccess.rules.outputs import cell_dtype
from safeaccess.rules.qss import AuditPolicy, AuditState, admit
from safeaccess.rules.qss.delta import Refine, encode_delta

K = 10


def census(n: int, seed: int) -> dict[str, np.ndarray]:
    """Census-like columns with realistic skew (a few large categories, long tails)."""
    rng = np.random.default_rng(seed)

    def skewed(levels: int, power: float = 1.2) -> np.ndarray:
        weights = 1.0 / np.arange(1, levels + 1) ** power
        return rng.choice(levels, size=n, p=weights / weights.sum()).astype(np.int16)

    age = np.clip(rng.normal(40.0, 22.0, n), 0, 99).astype(np.int16)
    income = np.clip(rng.lognormal(10.2, 0.6, n), 0, 400_000)
    return {
        "region": skewed(12, 0.6),
        "sex": rng.integers(0, 2, n).astype(np.int16),
        "age": age,
        "band": np.minimum(age // 5, 17).astype(np.int16),  # 18 bands, 85+ top-coded
        "ethnicity": skewed(6, 1.5),
        "employment": skewed(4, 1.0),
        "health": skewed(5, 0.8),
        "education": skewed(7, 0.7),
        "marital": skewed(5, 1.0),
        "household": np.clip(rng.poisson(1.6, n) + 1, 1, 8).astype(np.int16) - 1,
        "income_bin": np.digitize(income, np.linspace(0, 200_000, 21)[1:-1]).astype(np.int16),
    }


LEVELS = {
    "region": 12,
    "sex": 2,
    "band": 18,
    "ethnicity": 6,
    "employment": 4,
    "health": 5,
    "education": 7,
    "marital": 5,
    "household": 8,
    "income_bin": 20,
}


def cells_of(
    data: dict[str, np.ndarray], names: tuple[str, ...], mask: np.ndarray | None
) -> np.ndarray:
    """One query-set array: the cells of a table over `names`, -1 outside the filter, in the
    cell type the sandbox sends it in (`cell_dtype` of the table's number of cells)."""
    n = next(iter(data.values())).shape[0]
    cell = np.zeros(n, dtype=np.int32)
    for name in names:
        cell = cell * LEVELS[name] + data[name].astype(np.int32)
    if mask is not None:
        cell[~mask] = -1
    return cell.astype(cell_dtype(math.prod(LEVELS[name] for name in names)))


@dataclass
class Output:
    label: str
    arrays: list[np.ndarray]


def corpus(data: dict[str, np.ndarray], seed: int, rounds: int = 1) -> Iterator[Output]:
    """Six researchers' ordinary outputs, interleaved as they would arrive."""
    rng = np.random.default_rng(seed)
    n = next(iter(data.values())).shape[0]
    working = (data["age"] >= 16) & (data["age"] < 65)
    adults = data["age"] >= 18
    for r in range(rounds):
        # a fresh filter per round (a region group or an age range) stands for new sub-studies
        region_group = np.isin(data["region"], rng.choice(12, size=6, replace=False))
        older = data["age"] >= int(rng.integers(40, 60))
        studies: list[list[Output]] = [
            [  # labour market
                Output(
                    "employment x sex (working age)",
                    [cells_of(data, ("employment", "sex"), working)],
                ),
                Output("region x employment", [cells_of(data, ("region", "employment"), None)]),
                Output(
                    "education x employment (working age)",
                    [cells_of(data, ("education", "employment"), working)],
                ),
            ],
            [  # health
                Output("health x age band", [cells_of(data, ("health", "band"), None)]),
                Output("health x sex", [cells_of(data, ("health", "sex"), None)]),
                Output(
                    "health x ethnicity (adults)", [cells_of(data, ("health", "ethnicity"), adults)]
                ),
            ],
            [  # income
                Output(
                    "income histogram (declared edges)", [cells_of(data, ("income_bin",), adults)]
                ),
                Output("income histogram by sex", [cells_of(data, ("sex", "income_bin"), adults)]),
                Output("mean income by region", [cells_of(data, ("region",), adults)]),
                Output(
                    "income ~ C(sex) + C(education) + age",
                    [
                        cells_of(data, (), working),
                        cells_of(data, ("sex",), working),
                        cells_of(data, ("education",), working),
                    ],
                ),
            ],
            [  # households and family
                Output(
                    "household size x marital", [cells_of(data, ("household", "marital"), adults)]
                ),
                Output("marital x region", [cells_of(data, ("marital", "region"), None)]),
                Output(
                    "household size by region group", [cells_of(data, ("household",), region_group)]
                ),
            ],
            [  # demography
                Output("age band x sex", [cells_of(data, ("band", "sex"), None)]),
                Output("ethnicity x region", [cells_of(data, ("ethnicity", "region"), None)]),
                Output("education x sex", [cells_of(data, ("education", "sex"), None)]),
            ],
            [  # ageing
                Output(
                    "health x employment (older)", [cells_of(data, ("health", "employment"), older)]
                ),
                Output("mean income by age band", [cells_of(data, ("band",), adults)]),
                Output(
                    "income ~ C(health) + C(region)",
                    [
                        cells_of(data, (), adults),
                        cells_of(data, ("health",), adults),
                        cells_of(data, ("region",), adults),
                    ],
                ),
            ],
        ]
        longest = max(len(s) for s in studies)
        for i in range(longest):
            for study in studies:
                if i < len(study):
                    out = study[i]
                    yield Output(f"round {r}: {out.label}", out.arrays)
    del n


def marginals(data: dict[str, np.ndarray]) -> Iterator[Output]:
    # issue 20's four tables: region; sex x age band; ethnicity x employment; health
    for names in (("region",), ("sex", "band"), ("ethnicity", "employment"), ("health",)):
        yield Output(" x ".join(names), [cells_of(data, names, None)])


@dataclass
class Tally:
    released: int = 0
    total: int = 0
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    growth: list[int] = field(default_factory=list)
    deltas: list[int] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def run(name: str, data: dict[str, np.ndarray], outputs: Iterator[Output], verbose: bool) -> Tally:
    n = next(iter(data.values())).shape[0]
    policy = AuditPolicy(k=K)
    universe = admit(AuditState.empty(n), [np.zeros(n, dtype=np.int8)], policy)
    assert universe.state is not None
    state = universe.state
    size = len(state.to_bytes())
    tally = Tally()
    last_facts: dict[str, object] = {}
    for out in outputs:
        w0, c0 = time.perf_counter(), time.process_time()
        result = admit(state, out.arrays, policy)
        tally.wall.append(time.perf_counter() - w0)
        tally.cpu.append(time.process_time() - c0)
        tally.total += 1
        if result.admitted:
            assert result.state is not None
            state = result.state
            tally.released += 1
            new_size = len(state.to_bytes())
            tally.growth.append(new_size - size)
            tally.deltas.append(sum(map(len, encode_delta(state, [Refine(a) for a in out.arrays]))))
            size = new_size
            last_facts = result.facts
        else:
            tally.refused.append(f"{out.label}: {result.reason}")
        if verbose:
            cert = result.facts.get("certificate", {})
            print(
                f"    {'released' if result.admitted else 'REFUSED '} {out.label:45s} "
                f"atoms {result.facts['atoms_after']:>7} rank {result.facts.get('rank', '-'):>5} "
                f"cert {cert} {1000 * tally.wall[-1]:7.1f} ms"
            )
    w = np.asarray(tally.wall) * 1000
    c = np.asarray(tally.cpu) * 1000
    cert = last_facts.get("certificate", {})
    print(
        f"{name}: released {tally.released}/{tally.total} "
        f"({100 * tally.released / max(1, tally.total):.0f} %) on {n:,} records"
    )
    print(
        f"    final: {state.n_atoms:,} atoms ({int((state.sizes < K).sum()):,} below k), "
        f"rank {state.n_constraints}, {state.n_query_sets} query sets; last certificate {cert}"
    )
    print(
        f"    admit wall median {np.median(w):.1f} ms, p95 {np.percentile(w, 95):.1f} ms, "
        f"max {w.max():.1f} ms; CPU median {np.median(c):.1f} ms, p95 {np.percentile(c, 95):.1f} ms, "
        f"max {c.max():.1f} ms"
    )
    if tally.growth:
        g = np.asarray(tally.growth) / 2**20
        print(
            f"    encoded state {size / 2**20:.1f} MiB; growth per release median "
            f"{np.median(g):.2f} MiB, max {g.max():.2f} MiB"
        )
        d = np.asarray(tally.deltas) / 2**20
        print(
            f"    a release's delta file (what the server writes between full states): median "
            f"{np.median(d):.2f} MiB, max {d.max():.2f} MiB"
        )
    for line in tally.refused:
        print(f"    refused: {line}")
    return tally


def state_files(data: dict[str, np.ndarray], steps: int) -> None:
    """`steps` admissions of the marginals' tables into one scope through the server's
    `StateFiles`, as a step does (load from the pointer, admit the population, admit, save,
    then queue the full state once the step is recorded: `compact`): the time of each save (what
    the step waits for), of each background full write, and of cold loads (a new `StateFiles`,
    nothing cached): of the last state (its full file), of a state whose full write never
    happened (a crash after its delta: the parent's full file and one delta), and of the
    deepest chain a scope can have (`FULL_EVERY - 1` deltas, when no full write completes)."""
    import tempfile
    from pathlib import Path

    from safeaccess.server.outcome import QssPointer
    from safeaccess.server.qss.compaction import COMPACTOR
    from safeaccess.server.qss.gate import FULL_EVERY, FULL_SUFFIX, StateFiles
    from safeaccess.server.qss.universe import Population, ScopeState, admit_populations

    n = next(iter(data.values())).shape[0]
    policy, scope = AuditPolicy(k=K), "bench/project/p"
    tables = [out.arrays[0] for out in marginals(data)]
    fulls: list[float] = []

    class Timed(StateFiles):
        def write_full(self, scope: str, digest: str, state: ScopeState) -> Path | None:
            start = time.perf_counter()
            try:
                return super().write_full(scope, digest, state)
            finally:
                fulls.append((time.perf_counter() - start) * 1000)

    def chain(files: StateFiles, count: int, compact: bool) -> tuple[list[float], list[str]]:
        pointer: QssPointer | None = None
        saves, digests = [], []
        for step in range(count):
            loaded = files.load(scope, pointer, n)
            prepared, _ = admit_populations(loaded, [Population.of(1, np.arange(n))], policy)
            cells = tables[step % len(tables)]
            result = admit(prepared.state, [cells], policy)
            assert result.admitted and result.state is not None
            start = time.perf_counter()
            digest = files.save(scope, prepared.refined(result.state, [cells]))
            saves.append((time.perf_counter() - start) * 1000)
            if compact:
                files.compact(scope, digest)  # as `Admission.release` does once recorded
            pointer = QssPointer(digest, n, 1)
            digests.append(digest)
        COMPACTOR.wait()
        return saves, digests

    def cold(root: Path, digest: str) -> str:
        """Three cold loads (a new `StateFiles` each): the fastest and the slowest."""
        times = []
        for _ in range(3):
            start = time.perf_counter()
            StateFiles(root).load(scope, QssPointer(digest, n, 1), n)
            times.append(time.perf_counter() - start)
        return f"{min(times):.2f}-{max(times):.2f}"

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "compacted"
        saves, digests = chain(Timed(root), steps, compact=True)
        print(
            f"state files at {n:,} records, {steps} admitted steps: save (what a step waits for) "
            f"median {np.median(saves):.1f} ms, mean {np.mean(saves):.1f} ms, max "
            f"{max(saves):.1f} ms (the first, a new scope's: {saves[0]:.1f} ms)"
        )
        if fulls:
            print(
                f"    background full writes: {len(fulls)}, median {np.median(fulls):.1f} ms, "
                f"max {max(fulls):.1f} ms"
            )
        folder = next(root.rglob(f"{digests[-1]}.state")).parent
        compacted = any(folder.glob(f"{digests[-1]}.*{FULL_SUFFIX}"))
        last = "its full file" if compacted else "the newest full file + the deltas after it"
        print(f"    cold load of the last state ({last}): {cold(root, digests[-1])} s")
        for full in folder.glob(f"{digests[-1]}.*{FULL_SUFFIX}"):
            full.unlink()  # as if the process died between the delta and its full write
        print(
            f"    cold load of the last state with its full file gone (as after a crash before "
            f"its background write): {cold(root, digests[-1])} s"
        )
        sizes = sorted(p.stat().st_size / 2**20 for p in folder.iterdir())
        print(f"    files on disk (no pruning): {np.round(sizes, 2).tolist()} MiB")
        bare = Path(tmp) / "deltas"
        saves, digests = chain(StateFiles(bare), FULL_EVERY, compact=False)
        print(
            f"    no background writes at all: saves {np.round(saves, 1).tolist()} ms (the last "
            f"written full on the path: the bound); cold load of the deepest delta "
            f"({FULL_EVERY - 1} deep, from the empty state): {cold(bare, digests[-2])} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workloads", default="marginals,corpus,cost")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--big-records", type=int, default=10_000_000)
    parser.add_argument(
        "--cost-sets",
        "--sets",
        type=int,
        default=1_000,
        help="query sets the cost workload reaches",
    )
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument(
        "--state-steps", type=int, default=16, help="admissions of the statefiles workload"
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    print(f"k={K}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    wanted = set(args.workloads.split(","))
    if "marginals" in wanted:
        for n in (100_000, args.big_records):
            data = census(n, args.seed)
            run(f"marginals at {n:,}", data, marginals(data), args.verbose)
    if "statefiles" in wanted:
        state_files(census(args.big_records, args.seed), args.state_steps)
    data = census(args.records, args.seed)
    if "corpus" in wanted:
        run("corpus", data, corpus(data, args.seed), args.verbose)
    if "cost" in wanted:
        # enough rounds of the corpus (each on fresh filters) to pass the target number of sets
        per_round = sum(
            len(np.unique(a[a >= 0])) for out in corpus(data, args.seed) for a in out.arrays
        )
        rounds = max(1, -(-args.cost_sets // per_round))
        print(f"cost: {rounds} rounds of about {per_round} query sets each")
        tally = run("cost", data, corpus(data, args.seed, rounds), args.verbose)
        last = -len(tally.wall) // rounds
        tail = np.asarray(tally.wall[last:]) * 1000
        tail_cpu = np.asarray(tally.cpu[last:]) * 1000
        print(
            f"    last round: admit wall median {np.median(tail):.1f} ms, p95 "
            f"{np.percentile(tail, 95):.1f} ms; CPU median {np.median(tail_cpu):.1f} ms, p95 "
            f"{np.percentile(tail_cpu, 95):.1f} ms (target: 50 ms median)"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
