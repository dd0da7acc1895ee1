"""Checked tables on 1 000 000 records: safeaccess vs ACRO 1.0.2 vs bare pandas, every table kind.

Each table with all checks of its class, in one process beside ACRO:
- frequency table: one-way count of area (40 levels), as a count pivot;
- count crosstab of area x age (40 x 36 cells; threshold, zeros, class disclosure);
- mean and sum crosstabs and pivots of income by area x job (40 x 18; threshold, zeros, N-K,
  p-ratio, negatives);
- histogram of income, 20 bins (the sandbox's histogram plus the checks; ACRO's `hist` draws and
  saves the figure, which is what a researcher asks it for).

Prints, per table: ACRO's time (best of `--acro-repeat` runs), ours (worst of 3, end to end:
tabulate, facts, checks, DataFrames of values and per-cell status), the speed-up ACRO / ours, and
bare pandas (best of 3, no checks). Keys are integer codes and, separately, strings.

Then, keys "codes": the string-keyed data stored as a dataset version with its code arrays
(`safeaccess.sandbox.codes`), and each table (but the histogram, which has no key) made the way
the sandbox makes it on them: the runner's compute function on the memory-mapped codes (with the
query set of every record, which the researcher-side tables do not build) plus the checks.
The speed-up is over ACRO's time on the same strings, measured in the row above.

Run: python benchmarks/rules_vs_acro.py [--rows N] [--skip-acro] [--acro-repeat K]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import safeaccess.rules as rules
from safeaccess.client.analyses import Histogram
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.sandbox.runner.compute.tables import histogram

HIST_BINS = 20


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Best and worst seconds of `repeat` calls."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), max(times)


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


METADATA = DatasetMetadata(
    name="bench",
    columns=[
        Column(name="area", type="categorical"),
        Column(name="age", type="categorical"),
        Column(name="job", type="categorical"),
        Column(name="income", type="continuous"),
    ],
)


@dataclass(frozen=True)
class Case:
    """One table kind: ours, ACRO's and bare pandas' way of making it, and the sandbox's
    analysis of the same table (None: the table has no key to code)."""

    name: str
    ours: Callable[[pd.DataFrame], Any]
    acro: Callable[[Any, pd.DataFrame], object]
    bare: Callable[[pd.DataFrame], object]
    sandbox: dict[str, Any] | None = None


def _our_histogram(df: pd.DataFrame) -> rules.CheckedTable | Any:
    out = histogram(Histogram(variable="income", bins=HIST_BINS), df, METADATA, len(df))
    return rules.check(out)


def _magnitude(agg: str) -> dict[str, Any]:
    return {
        "kind": "magnitude_table",
        "rows": ["area"],
        "cols": ["job"],
        "value": "income",
        "agg": agg,
    }


def _on_codes(analysis: dict[str, Any], frame: pd.DataFrame, codes: Any) -> Any:
    """The sandbox's table of `analysis` on stored code arrays, checked."""
    from safeaccess.client.analyses import parse_analysis
    from safeaccess.sandbox.runner.kinds import KINDS
    from safeaccess.sandbox.runner.stored_codes import using

    parsed = parse_analysis(analysis)
    with using(codes):
        out = KINDS[parsed.kind].load()(parsed, frame, METADATA, len(frame))
    return rules.check(out)


def _stored(df: pd.DataFrame) -> tuple[pd.DataFrame, Any]:
    """`df` stored as a dataset version with its code arrays: the frame a template decodes and
    the mapped arrays."""
    import pyarrow.parquet as pq

    from safeaccess.sandbox.codes import load_codes, write_codes

    path = os.path.join(tempfile.mkdtemp(prefix="codes-bench-"), "v1.parquet")
    df.to_parquet(path, index=False)
    write_codes(Path(path), METADATA)
    return pq.read_table(path).to_pandas(), load_codes(Path(path))


def _cases() -> list[Case]:
    pivot = pd.pivot_table
    return [
        Case(
            "frequency (area)",
            lambda df: rules.pivot_table(df, values="income", index="area", aggfunc="count"),
            lambda s, df: s.pivot_table(df, values="income", index="area", aggfunc="count"),
            lambda df: pivot(df, values="income", index="area", aggfunc="count"),
            {"kind": "frequency_table", "rows": ["area"]},  # no income is missing
        ),
        Case(
            "count crosstab (area x age)",
            lambda df: rules.crosstab(df["area"], df["age"]),
            lambda s, df: s.crosstab(df["area"], df["age"]),
            lambda df: pd.crosstab(df["area"], df["age"]),
            {"kind": "frequency_table", "rows": ["area"], "cols": ["age"]},
        ),
        Case(
            "mean crosstab (area x job)",
            lambda df: rules.crosstab(df["area"], df["job"], values=df["income"], aggfunc="mean"),
            lambda s, df: s.crosstab(df["area"], df["job"], values=df["income"], aggfunc="mean"),
            lambda df: pd.crosstab(df["area"], df["job"], values=df["income"], aggfunc="mean"),
            _magnitude("mean"),
        ),
        Case(
            "mean pivot (area x job)",
            lambda df: rules.pivot_table(df, "income", "area", "job", aggfunc="mean"),
            lambda s, df: s.pivot_table(df, "income", "area", "job", aggfunc="mean"),
            lambda df: pivot(df, "income", "area", "job", aggfunc="mean"),
            _magnitude("mean"),
        ),
        Case(
            "sum pivot (area x job)",
            lambda df: rules.pivot_table(df, "income", "area", "job", aggfunc="sum"),
            lambda s, df: s.pivot_table(df, "income", "area", "job", aggfunc="sum"),
            lambda df: pivot(df, "income", "area", "job", aggfunc="sum"),
            _magnitude("sum"),
        ),
        Case(
            f"histogram (income, {HIST_BINS} bins)",
            _our_histogram,
            lambda s, df: s.hist(df, "income", bins=HIST_BINS),
            lambda df: np.histogram(df["income"].to_numpy(), bins=HIST_BINS),
        ),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--skip-acro", action="store_true")
    ap.add_argument("--acro-repeat", type=int, default=1)
    args = ap.parse_args()

    acro_session = None
    if not args.skip_acro:
        from acro import ACRO

        logging.disable(logging.INFO)
        os.chdir(tempfile.mkdtemp(prefix="acro-bench-"))  # ACRO writes files into the cwd
        acro_session = ACRO(suppress=False)

    print(f"{args.rows:,} records; ours: worst of 3; ACRO: best of {args.acro_repeat}")
    header = (
        f"{'table':<32}{'keys':<6}{'ACRO s':>9}{'ours s':>9}{'speed-up':>10}"
        f"{'pandas s':>10}{'ours/pd':>9}"
    )
    print(header)
    print("-" * len(header))
    worst_ratio = float("inf")
    acro_on_strings: dict[str, float] = {}
    for strings in (False, True):
        df = make_data(args.rows, strings)
        for case in _cases():
            ratio, t_acro = run_case(case, df, strings, acro_session, args.acro_repeat)
            worst_ratio = min(worst_ratio, ratio)
            if strings:
                acro_on_strings[case.name] = t_acro
    frame, codes = _stored(df)
    for case in _cases():
        if case.sandbox is None:
            continue
        analysis = case.sandbox
        _on_codes(analysis, frame, codes)  # warm-up, as for the other rows
        _, t_ours = timed(lambda a=analysis: _on_codes(a, frame, codes), 3)
        t_acro = acro_on_strings.get(case.name, float("nan"))
        ratio = t_acro / t_ours if acro_session is not None else float("inf")
        worst_ratio = min(worst_ratio, ratio)
        acro_s = f"{t_acro:9.3f}" if acro_session is not None else f"{'-':>9}"
        ratio_s = f"{ratio:9.1f}x" if acro_session is not None else f"{'-':>10}"
        print(f"{case.name:<32}{'codes':<6}{acro_s}{t_ours:9.3f}{ratio_s}", flush=True)
    if acro_session is not None:
        print(f"lowest speed-up over ACRO: {worst_ratio:.1f}x")


def run_case(
    case: Case, df: pd.DataFrame, strings: bool, acro_session: object | None, acro_repeat: int
) -> tuple[float, float]:
    """Time one table three ways, print a row, return ACRO's time over ours (inf without ACRO)
    and ACRO's time (nan without ACRO)."""
    case.ours(df)  # warm-up: imports and first-call caches are not the table's cost
    _, t_ours = timed(lambda: case.ours(df), 3)
    t_pd, _ = timed(lambda: case.bare(df), 3)
    ratio, t_acro = float("inf"), float("nan")
    if acro_session is not None:
        t_acro, _ = timed(lambda: case.acro(acro_session, df), acro_repeat)
        ratio = t_acro / t_ours
        acro_s, ratio_s = f"{t_acro:9.3f}", f"{ratio:9.1f}x"
    else:
        acro_s, ratio_s = f"{'-':>9}", f"{'-':>10}"
    print(
        f"{case.name:<32}{'str' if strings else 'int':<6}{acro_s}{t_ours:9.3f}{ratio_s}"
        f"{t_pd:10.3f}{t_ours / t_pd:9.2f}",
        flush=True,
    )
    return ratio, t_acro


if __name__ == "__main__":
    main()
