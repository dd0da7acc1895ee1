"""Benchmark the synthetic-data disclosure checks (`safeaccess.rules.synthetic`).

Prints seconds for: exact GCAP (Hittmeir Alg. 3.1, ties kept) and its leave-one-out reference on
100 000 real x 100 000 synthetic records with 6 keys (target <= 2 s each), next to a naive pass
over the unique keys extrapolated from a sample; the full default attack check (3 targets, key
sets of lengths 2, 3 and 6, LOO and a 200-resample bootstrap each; target <= 30 s); DCR with a
k-d tree or the cell search at dimension 5, 8 and 10 (target <= 2 s), before and after the
cell search (`--only-dcr` runs only that); and scipy's Hungarian matching at m = 1 000 to 5 000
(the cap of the (y,p)-coverage check). With --synthesis (needs the server's `synth`
extra): MST-G end to end on 100 000 x 8 (exact tables, OpenDP noise, tree, Private-PGM fit with
1 000 iterations, sampling; target <= 60 s) and the mean two-way TVD of the sample to the data;
--synthesis-large runs only that, on 1 000 000 x 30 (target <= 5 min).
With --check: the sandbox's whole disclosure check (job 2, `synthetic_check`, default rules) on
the 100 000 x 8 chain table against a fresh sample of the same chain (what a good release looks
like), total and per part, in CPU seconds; the sandbox's CPU limit is 60 s.

    python benchmarks/synthetic.py [--rows 100000] [--skip-hungarian] [--synthesis] [--check]
    python benchmarks/synthetic.py --synthesis-large
    python benchmarks/synthetic.py --only-dcr
    python benchmarks/synthetic.py --only-check
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist

from safeaccess.rules.synthetic import attack_check, dcr, gcap, gcap_loo
from safeaccess.rules.synthetic.coding import pack


def _timed(run: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = run()
    return time.perf_counter() - start, out


def _cpu_timed(run: Callable[[], Any]) -> tuple[float, Any]:
    """CPU seconds of this process (what the sandbox's CPU limit counts; the shared machine's
    wall time is not)."""
    start = time.process_time()
    out = run()
    return time.process_time() - start, out


def _correlated(rng: np.random.Generator, n: int, levels: list[int], noise: float) -> np.ndarray:
    """Each column a noisy copy of the previous one (a Markov chain), as survey keys are."""
    cols = [rng.integers(0, levels[0], n)]
    for lv in levels[1:]:
        keep = rng.random(n) > noise
        cols.append(np.where(keep, cols[-1] % lv, rng.integers(0, lv, n)))
    return np.stack(cols, axis=1)


def _independent(rng: np.random.Generator, n: int, levels: list[int]) -> np.ndarray:
    return np.stack([rng.integers(0, lv, n) for lv in levels], axis=1)


def _naive_seconds(real: np.ndarray, syn: np.ndarray, levels: list[int], sample: int) -> float:
    """A naive exact pass: each unique real key against every unique synthetic key (numpy
    Hamming distance per key), timed on `sample` keys and scaled to all of them."""
    ur = np.unique(pack(real, levels)[0])
    us_rows = np.unique(syn, axis=0)
    ur_rows = np.unique(real, axis=0)
    pick = ur_rows[:sample]
    start = time.perf_counter()
    for key in pick:
        dist = (us_rows != key).sum(axis=1)
        _ = dist == dist.min()
    took = time.perf_counter() - start
    return took / len(pick) * len(ur)


def bench_gcap(n: int) -> None:
    rng = np.random.default_rng(0)
    print(f"GCAP, exact with ties, {n} real x {n} synthetic, 6 keys, binary target")
    cases = {
        "correlated (8-12 levels)": ([12, 10, 8, 12, 10, 8], "corr"),
        "independent 50/40/30/20/10/60 levels": ([50, 40, 30, 20, 10, 60], "ind"),
        "independent 6 x 100 levels (worst realistic)": ([100] * 6, "ind"),
    }
    for name, (levels, kind) in cases.items():
        if kind == "corr":
            real = _correlated(rng, n, levels, 0.35)
            syn = _correlated(rng, n, levels, 0.35)
        else:
            real = _independent(rng, n, levels)
            syn = _independent(rng, n, levels)
        rt, st = rng.integers(0, 2, n), rng.integers(0, 2, n)
        t_gcap, (_, rho) = _timed(lambda: gcap(real, rt, syn, st, levels, 2))  # noqa: B023
        t_loo, (_, l_rho) = _timed(lambda: gcap_loo(real, rt, levels, 2))  # noqa: B023
        naive = _naive_seconds(real, syn, levels, 300)
        u_r = len(np.unique(real, axis=0))
        u_s = len(np.unique(syn, axis=0))
        print(
            f"  {name}: unique keys {u_r} / {u_s}, max rho {int(rho.max())} (LOO {int(l_rho.max())})"
        )
        print(
            f"    gcap {t_gcap:.2f} s   gcap_loo {t_loo:.2f} s   "
            f"naive over unique keys (extrapolated) {naive:.0f} s"
        )


def bench_attack(n: int) -> None:
    rng = np.random.default_rng(1)
    levels = [12, 10, 8, 12, 10, 8, 3, 4, 5]
    real = _correlated(rng, n, levels, 0.35)
    syn = _correlated(rng, n, levels, 0.35)
    took, rows = _timed(lambda: attack_check(real, syn, levels, range(6), [6, 7, 8]))
    print(
        f"Full attack check, {n} x {n}: 3 targets x {len(rows) // 3} key sets (lengths 2, 3, 6), "
        f"GCAP + LOO + 200-resample bootstrap each: {took:.1f} s"
    )


def bench_dcr(n: int) -> None:
    """`dcr` and `dcr_report` before and after the cell search, timed in turn on the same data
    (wall and CPU seconds: the shared machine's wall time depends on its load; run with
    OMP_NUM_THREADS=1 for the sandbox's single thread). "Before" is the previous code: the k-d
    tree alone (`CELLS_MIN_DIM` out of reach); the results must be identical, and the report
    equal to the one every DCR and LOO distance give."""
    from safeaccess.rules.synthetic import dcr_loo, dcr_report, distance

    rng = np.random.default_rng(2)
    cases = {
        "d = 5, uniform": (rng.random((n, 5)), rng.random((n, 5))),
        "d = 8, uniform": (rng.random((n, 8)), rng.random((n, 8))),
        "d = 10, uniform (worst case for a k-d tree)": (rng.random((n, 10)), rng.random((n, 10))),
    }
    mix = rng.random((3, 10))  # 10 features spanned by 3 latent ones, as correlated data are
    cases["d = 10, 3 latent dimensions"] = tuple(  # type: ignore[assignment]
        rng.random((n, 3)) @ mix + 0.01 * rng.random((n, 10)) for _ in range(2)
    )
    min_dim = distance.CELLS_MIN_DIM

    def both(old_run: Callable[[], Any], new_run: Callable[[], Any]) -> tuple[str, Any, Any]:
        w0, c0 = time.perf_counter(), time.process_time()
        distance.CELLS_MIN_DIM = 10**9  # the previous code: the k-d tree for every dimension
        try:
            old = old_run()
        finally:
            distance.CELLS_MIN_DIM = min_dim
        w1, c1 = time.perf_counter(), time.process_time()
        new = new_run()
        w2, c2 = time.perf_counter(), time.process_time()
        text = f"{w1 - w0:.2f} s ({c1 - c0:.2f} CPU) -> {w2 - w1:.2f} s ({c2 - c1:.2f} CPU)"
        return text, old, new

    def full_report(syn: np.ndarray, real: np.ndarray) -> Any:
        # every DCR and every LOO distance (what dcr_report's bounded searches must equal)
        return dcr_report(syn, real, distances=(dcr(syn, real)[0], dcr_loo(real)[0]))

    print(f"DCR, {n} x {n}, before -> after, wall (CPU) seconds; target <= 2 s")
    for name, (real, syn) in cases.items():
        run = lambda: dcr(syn, real)  # noqa: B023, E731
        text, old, new = both(run, run)
        same = np.array_equal(old[0], new[0]) and np.array_equal(old[1], new[1])
        print(f"  dcr, {name}: {text}; identical: {same}")
        run_report = lambda: dcr_report(syn, real)  # noqa: B023, E731
        text, old, new = both(run_report, run_report)
        print(
            f"  dcr_report (DCR + LOO reference), {name}: {text}; identical: {old == new}; "
            f"equal to the full searches': {new == full_report(syn, real)}"
        )


def bench_hungarian() -> None:
    rng = np.random.default_rng(3)
    for m in (1000, 2000, 4000, 5000):
        real, syn = rng.random((m, 5)), rng.random((m, 5))
        took, _ = _timed(lambda: linear_sum_assignment(cdist(syn, real)))  # noqa: B023
        print(
            f"Hungarian (scipy linear_sum_assignment + cdist), m = {m}, d = 5: {took:.2f} s "
            f"(cost matrix {m * m * 8 / 2**20:.0f} MiB)"
        )


SYNTH_LEVELS = [5, 4, 10, 3, 6, 2, 8, 12]


def bench_synthesis(n: int, d: int = 8) -> None:
    """MST-G end to end on an n x d chain table (levels cycle through SYNTH_LEVELS)."""
    from itertools import combinations

    from safeaccess.server.synth.fit import NoisyMarginal, fit_and_sample
    from safeaccess.server.synth.release import mst_release

    rng = np.random.default_rng(4)
    levels = [SYNTH_LEVELS[i % len(SYNTH_LEVELS)] for i in range(d)]
    data = _correlated(rng, n, levels, 0.4)

    def table(cols: tuple[int, ...]) -> np.ndarray:
        flat = np.ravel_multi_index(tuple(data[:, c] for c in cols), [levels[c] for c in cols])
        size = int(np.prod([levels[c] for c in cols]))
        return np.bincount(flat, minlength=size).astype(float)

    start = time.perf_counter()
    oneways = [table((c,)) for c in range(d)]
    pairs = {p: table(p) for p in combinations(range(d), 2)}
    t_tables = time.perf_counter() - start
    rel = mst_release(oneways, pairs, mu=0.182)
    t_release = time.perf_counter() - start - t_tables
    names = {c: f"c{c}" for c in range(d)}
    s1, _, s2 = rel.sigmas
    meas = [NoisyMarginal((names[c],), rel.noisy_oneways[c], s1) for c in range(d)]
    meas += [
        NoisyMarginal((names[a], names[b]), t, s2)
        for (a, b), t in zip(rel.tree, rel.noisy_tree, strict=True)
    ]
    fit = fit_and_sample({names[c]: levels[c] for c in range(d)}, meas, seed=0)
    took = time.perf_counter() - start
    t_fit = took - t_tables - t_release
    tvds = []
    for a, b in combinations(range(d), 2):
        syn = np.bincount(
            fit.data[:, a] * levels[b] + fit.data[:, b], minlength=levels[a] * levels[b]
        )
        tvds.append(0.5 * np.abs(syn / syn.sum() - pairs[(a, b)] / n).sum())
    print(
        f"MST-G synthesis, {n} x {d}, mu = 0.182: {took:.1f} s in all (tables {t_tables:.2f} s, "
        f"noise + tree {t_release:.2f} s, fit + sample {t_fit:.1f} s); tree {list(rel.tree)}; "
        f"{fit.data.shape[0]} rows; mean 2-way TVD {np.mean(tvds):.4f} (max {np.max(tvds):.4f})"
    )


def bench_check(n: int) -> None:
    import pandas as pd

    from safeaccess.client.analyses import SyntheticData
    from safeaccess.client.metadata import Column, DatasetMetadata
    from safeaccess.client.synthetic import synth_workload
    from safeaccess.rules.synthetic import (
        distance_features,
        reproduced_uniques,
        synthpop_measures,
        uniques_excess,
        yp_coverage_sampled,
    )
    from safeaccess.rules.synthetic.distance import dcr_report, hamming_dcr
    from safeaccess.sandbox.runner.compute.synthetic import (
        code_records,
        encode_codes,
        synthetic_check,
    )

    levels = [5, 4, 10, 3, 6, 2, 8, 12]
    names = [f"c{i}" for i in range(len(levels))]
    real_codes = _correlated(np.random.default_rng(7), n, levels, 0.4)
    syn = _correlated(np.random.default_rng(8), n, levels, 0.4)
    frame = pd.DataFrame(dict(zip(names, real_codes.T, strict=True)))
    meta = DatasetMetadata(
        name="chain",
        columns=[
            Column(name=c, type="categorical", levels=list(range(lv)), nullable=False)
            for c, lv in zip(names, levels, strict=True)
        ],
    )
    analysis = SyntheticData(columns=names, epsilon=1.0, delta=1e-9)
    request = {
        "analysis": analysis.model_dump(mode="json"),
        "synthetic": encode_codes(syn),
        "rules": {},
        "seed": 5,
    }
    took, out = _cpu_timed(lambda: synthetic_check(request, frame, meta))
    checks = out.facts.checks
    print(
        f"Whole check (sandbox job 2), {n} x {len(levels)} chain table against a fresh sample, "
        f"{len(checks['attack'])} attack rows: {took:.1f} s CPU, verdict {out.facts.verdict}"
    )
    o = code_records(frame, synth_workload(analysis, meta))
    parts = {
        "attack (GCAP, back-off LOO references, bootstrap)": lambda: attack_check(
            o, syn, levels, range(8), range(8)
        ),
        "synthpop measures, 8 targets": lambda: [
            synthpop_measures(np.delete(o, t, 1), o[:, t], np.delete(syn, t, 1), syn[:, t])
            for t in range(8)
        ],
        "reproduced uniques + split-half reference": lambda: (
            reproduced_uniques(o, syn),
            uniques_excess(o, syn),
        ),
    }
    fo, fs = distance_features(o, levels), distance_features(syn, levels)
    exact = hamming_dcr(syn, o, levels)
    parts["DCR by Hamming shells, all records"] = lambda: dcr_report(
        fs, fo, distances=hamming_dcr(syn, o, levels)
    )
    threshold = dcr_report(fs, fo, distances=exact).threshold
    parts["(y,p)-coverage, 3 Hungarian samples of 5 000"] = lambda: yp_coverage_sampled(
        fo, fs, threshold, 0.10, m=5000, nearest=exact[0]
    )
    for name, run in parts.items():
        print(f"  {name}: {_cpu_timed(run)[0]:.1f} s CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--skip-hungarian", action="store_true")
    parser.add_argument("--synthesis", action="store_true")
    parser.add_argument("--synthesis-large", action="store_true", help="MST-G on 1M x 30 alone")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--only-check", action="store_true")
    parser.add_argument("--only-dcr", action="store_true")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}")
    if args.only_dcr:
        bench_dcr(args.rows)
        return
    if args.synthesis_large:
        bench_synthesis(1_000_000, 30)
        return
    if args.only_check:
        bench_check(args.rows)
        return
    bench_gcap(args.rows)
    bench_attack(args.rows)
    bench_dcr(args.rows)
    if not args.skip_hungarian:
        bench_hungarian()
    if args.synthesis:
        bench_synthesis(args.rows)
    if args.check:
        bench_check(args.rows)


if __name__ == "__main__":
    main()
