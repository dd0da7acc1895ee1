"""Checked tables on 1 000 000 records: safeaccess.rules vs ACRO 1.0.2 vs bare pandas.

Two tables, each with all checks of its class:
- a count crosstab of about 40 x 36 cells (threshold, zeros, class disclosure);
- a mean crosstab of about 40 x 18 cells (threshold, zeros, N-K, p-ratio, negatives).

Prints, per table: ACRO's time (one run: it is slow), ours (best of 3, end to end: tabulate,
facts, checks, DataFrames of values and per-cell status), the speed-up, and bare `pd.crosstab`
(best of 3, no checks). Keys are integer codes and, separately, strings.

Run: python benchmarks/rules_vs_acro.py [--rows N] [--skip-acro]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

import safeaccess.rules as rules


def best_of(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def make_data(n: int, strings: bool, seed: int = 2026) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    # skewed levels so that some cells are small, as in real tables, and a few huge incomes
    # so that dominance fires somewhere: the checks must find and describe failing cells
    p40 = np.geomspace(1.0, 1e-3, 40)
    p40 /= p40.sum()
    df = pd.DataFrame(
        {
            "area": rng.choice(40, n, p=p40),
            "age": rng.integers(0, 36, n),
            "job": rng.integers(0, 18, n),
            "income": rng.lognormal(10.0, 1.0, n),
        }
    )
    df.loc[rng.choice(n, 5, replace=False), "income"] = 1e9
    if strings:
        for col in ("area", "age", "job"):
            df[col] = df[col].map(lambda x, c=col: f"{c}{x:02d}")
    return df


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--skip-acro", action="store_true")
    args = ap.parse_args()

    acro_session = None
    if not args.skip_acro:
        from acro import ACRO

        logging.disable(logging.INFO)
        os.chdir(tempfile.mkdtemp(prefix="acro-bench-"))  # ACRO writes files into the cwd
        acro_session = ACRO(suppress=False)

    print(f"{args.rows:,} records")
    header = f"{'table':<28}{'keys':<8}{'cells':>7}{'ACRO s':>10}{'ours s':>10}{'speed-up':>10}{'pd.crosstab s':>15}{'ours/pd':>9}"
    print(header)
    print("-" * len(header))
    for strings in (False, True):
        df = make_data(args.rows, strings)
        cases = [
            ("count (area x age)", "age", None, None),
            ("mean income (area x job)", "job", "income", "mean"),
        ]
        for name, col, values, aggfunc in cases:
            run_case(name, df, col, values, aggfunc, strings, acro_session)


def run_case(
    name: str,
    df: pd.DataFrame,
    col: str,
    values: str | None,
    aggfunc: str | None,
    strings: bool,
    acro_session: object | None,
) -> None:
    """Time one table three ways and print a row."""
    vals = df[values] if values else None

    def ours() -> rules.CheckedTable:
        return rules.crosstab(df["area"], df[col], values=vals, aggfunc=aggfunc)

    def bare() -> object:
        return pd.crosstab(df["area"], df[col], values=vals, aggfunc=aggfunc)

    res = ours()
    t_ours = best_of(ours, 3)
    t_pd = best_of(bare, 3)
    if acro_session is not None:
        t0 = time.perf_counter()
        acro_session.crosstab(df["area"], df[col], values=vals, aggfunc=aggfunc)  # type: ignore[attr-defined]
        t_acro = time.perf_counter() - t0
        acro_s, ratio = f"{t_acro:10.3f}", f"{t_acro / t_ours:9.1f}x"
    else:
        acro_s, ratio = f"{'-':>10}", f"{'-':>10}"
    print(
        f"{name:<28}{'str' if strings else 'int':<8}{res.table.size:>7}{acro_s}{t_ours:10.3f}"
        f"{ratio}{t_pd:15.3f}{t_ours / t_pd:9.2f}   verdict {res.verdict}, "
        f"{sum(1 for f in res.decision.findings)} findings"
    )


if __name__ == "__main__":
    main()
