"""Query-set auditor timings at census scale (issue 8).

10 M census-like records (region 40, age band 18, sex, ethnicity 5, health 5, employment 3), a
sequence of 1 000 filters and 200 tables of about 50 cells in random order, admitted one output at
a time in each mode. Prints admit time (median, p95; wall and CPU: the machine may be shared),
state memory and peak RSS, and span mode's cost against the number of atoms.

Run: python benchmarks/qss.py [--records N] [--filters F] [--tables T] [--span-budget SECONDS]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections.abc import Iterator

import numpy as np

from safeaccess.rules.qss import AuditMode, AuditPolicy, AuditState, admit

K = 10
VARIABLES = {"region": 40, "age": 18, "sex": 2, "ethnicity": 5, "health": 5, "employment": 3}
# table shapes of about 50 cells
TABLES = [("age", "employment"), ("sex", "ethnicity", "health"), ("region",), ("health", "age")]


def census(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.integers(0, levels, n).astype(np.int8) for name, levels in VARIABLES.items()}


def workload(
    data: dict[str, np.ndarray], n_filters: int, n_tables: int, seed: int
) -> Iterator[tuple[str, np.ndarray]]:
    """Filters (a random condition on two or three variables) and tables (cells of one of the
    shapes above, over everyone or within a region range), in random order."""
    rng = np.random.default_rng(seed)
    kinds = ["filter"] * n_filters + ["table"] * n_tables
    rng.shuffle(kinds)
    n = next(iter(data.values())).shape[0]
    for kind in kinds:
        if kind == "filter":
            mask = np.ones(n, dtype=bool)
            for name in rng.choice(list(VARIABLES), size=int(rng.integers(2, 4)), replace=False):
                levels = VARIABLES[str(name)]
                keep = rng.choice(levels, size=int(rng.integers(1, max(2, levels))), replace=False)
                mask &= np.isin(data[str(name)], keep)
            yield kind, np.where(mask, 0, -1).astype(np.int32)
        else:
            shape = TABLES[int(rng.integers(len(TABLES)))]
            cell = np.zeros(n, dtype=np.int32)
            for name in shape:
                cell = cell * VARIABLES[name] + data[name]
            if rng.random() < 0.5:
                lo = int(rng.integers(0, 30))
                cell[(data["region"] < lo) | (data["region"] >= lo + 10)] = -1
            yield kind, cell


def state_bytes(state: AuditState) -> int:
    total = state.atom_of.nbytes + state.sizes.nbytes
    c = state.constraints
    if c is not None:
        total += c.indptr.nbytes + c.indices.nbytes
        for lane in c.lanes:
            total += lane.d.nbytes + lane.basis.nbytes + lane.k_mat.nbytes + lane.k_inv.nbytes
    return total


def run(mode: AuditMode, data: dict[str, np.ndarray], args: argparse.Namespace) -> None:
    n = next(iter(data.values())).shape[0]
    state = AuditState.empty(n)
    policy = AuditPolicy(mode=mode, k=K)
    wall: list[float] = []
    cpu: list[float] = []
    curve: list[tuple[int, int, float]] = []
    admitted = refused = fallback = 0
    started = time.perf_counter()
    for step, (_, cells) in enumerate(workload(data, args.filters, args.tables, args.seed)):
        w0, c0 = time.perf_counter(), time.process_time()
        result = admit(state, [cells], policy)
        w1, c1 = time.perf_counter(), time.process_time()
        wall.append(w1 - w0)
        cpu.append(c1 - c0)
        if result.facts.get("rule") == "span":
            curve.append((result.facts["atoms_after"], state.n_constraints, w1 - w0))
        if result.facts.get("fallback"):
            fallback += 1
        if result.admitted:
            admitted += 1
            assert result.state is not None
            state = result.state
        else:
            refused += 1
        if mode is AuditMode.SPAN and time.perf_counter() - started > args.span_budget:
            print(f"  span: stopped after {step + 1} outputs (budget {args.span_budget:.0f} s)")
            break
    w = np.asarray(wall) * 1000
    c = np.asarray(cpu) * 1000
    print(
        f"{mode.value:5s}: {len(w)} admits ({admitted} admitted, {refused} refused, "
        f"{fallback} on the atoms-rule fallback); wall median {np.median(w):.1f} ms, "
        f"p95 {np.percentile(w, 95):.1f} ms; CPU median {np.median(c):.1f} ms, "
        f"p95 {np.percentile(c, 95):.1f} ms"
    )
    print(
        f"       final state: {state.n_atoms} atoms, {state.n_constraints} constraints, "
        f"{state_bytes(state) / 2**20:.1f} MiB in memory, {len(state.to_bytes()) / 2**20:.1f} MiB "
        f"encoded ({state_bytes(state) / n:.2f} bytes per record)"
    )
    if curve:
        print("       span cost against atoms (admits on the span rule):")
        print("         atoms up to   admits   median ms   max ms   constraints (median)")
        edges = [10, 100, 1_000, 10_000, 30_000, 100_000, 10**9]
        atoms = np.asarray([a for a, _, _ in curve])
        cons = np.asarray([r for _, r, _ in curve])
        times = np.asarray([t for _, _, t in curve]) * 1000
        low = 0
        for edge in edges:
            sel = (atoms > low) & (atoms <= edge)
            if sel.any():
                print(
                    f"         {edge:>11,}   {int(sel.sum()):6d}   {np.median(times[sel]):9.1f}"
                    f"   {times[sel].max():6.1f}   {int(np.median(cons[sel])):8d}"
                )
            low = edge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--filters", type=int, default=1_000)
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--span-budget", type=float, default=900.0)
    parser.add_argument("--modes", default="atoms,span")
    args = parser.parse_args()
    print(
        f"records {args.records:,}, {args.filters} filters + {args.tables} tables, k={K}, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    t = time.perf_counter()
    data = census(args.records, args.seed)
    print(f"census generated in {time.perf_counter() - t:.1f} s")
    for name in args.modes.split(","):
        run(AuditMode(name), data, args)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"       peak RSS of the process so far: {peak:.0f} MiB")
    print("target: atoms mode median below 50 ms per admit at 10 M records")


if __name__ == "__main__":
    main()
