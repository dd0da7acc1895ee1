"""Benchmark the analysis language: grammar parsing, row filters and design matrices.

Prints microseconds per parse for typical filters and formulas, rows per second for `row_mask`,
and the time to build a design matrix with `design_matrices` next to patsy's `dmatrices` (the
reference implementation statsmodels uses) on the same data.

    python benchmarks/analysis_language.py [--rows 200000]
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import patsy

from safeaccess.client.grammar import parse_filter, parse_formula
from safeaccess.sandbox.runner.design import design_matrices
from safeaccess.sandbox.runner.filters import row_mask

FILTER = "age >= 18 and (sex = 'F' or region in ('north', 'east')) and income is not null"
FORMULA = "log(income) ~ age * C(sex) + C(region) + I(age ** 2)"


def _best(run: Callable[[], object], min_seconds: float = 0.5) -> float:
    """Seconds per call, best of repeated runs lasting about `min_seconds` in total."""
    best = float("inf")
    spent = 0.0
    while spent < min_seconds or best == float("inf"):
        start = time.perf_counter()
        run()
        took = time.perf_counter() - start
        best = min(best, took)
        spent += took
    return best


def _frame(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    df = pd.DataFrame(
        {
            "age": rng.integers(0, 90, n).astype(float),
            "sex": rng.choice(["F", "M"], n),
            "region": rng.choice(["north", "south", "east", "west"], n),
            "income": rng.lognormal(10, 0.6, n),
        }
    )
    df.loc[rng.random(n) < 0.02, "income"] = np.nan
    return df


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}")

    print(
        f"parse_filter  ({len(FILTER)} chars): {_best(lambda: parse_filter(FILTER)) * 1e6:8.1f} us"
    )
    print(
        f"parse_formula ({len(FORMULA)} chars): {_best(lambda: parse_formula(FORMULA)) * 1e6:8.1f} us"
    )

    df = _frame(args.rows)
    mask_s = _best(lambda: row_mask(df, FILTER))
    print(
        f"row_mask on {args.rows} rows: {mask_s * 1e3:8.1f} ms ({args.rows / mask_s / 1e6:.1f} M rows/s)"
    )
    pandas_s = _best(
        lambda: (
            (df["age"] >= 18)
            & ((df["sex"] == "F") | df["region"].isin(["north", "east"]))
            & df["income"].notna()
        )
    )
    print(f"  same mask with hand-written pandas: {pandas_s * 1e3:8.1f} ms")

    ours = design_matrices(df, FORMULA)
    ours_s = _best(lambda: design_matrices(df, FORMULA))
    env = patsy.EvalEnvironment([{"log": np.log}])
    _y, X = patsy.dmatrices(FORMULA, df, eval_env=env)
    assert ours.columns == X.design_info.column_names
    patsy_s = _best(lambda: patsy.dmatrices(FORMULA, df, eval_env=env))
    print(
        f"design_matrices {ours.X.shape[0]}x{ours.X.shape[1]}: {ours_s * 1e3:8.1f} ms"
        f"   patsy.dmatrices: {patsy_s * 1e3:8.1f} ms   (same columns)"
    )


if __name__ == "__main__":
    main()
