"""Reconstruction-risk timings: Derrick et al.'s k = 5 table, counts of samples consistent with
a released mean and SD, and the output check on large groups.

Run: python benchmarks/reconstruction.py [--budget SECONDS]
Prints one line per measurement. Counts that need more DP steps than the budget allows are
reported as "over budget" with the time it took to give up.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from fractions import Fraction
from types import SimpleNamespace

import numpy as np

from safeaccess.rules.outputs import (
    SummaryFacts,
    SummaryGroup,
    SummaryGroupFacts,
    SummaryOutput,
    SummaryVariableFacts,
    VariableSummary,
)
from safeaccess.rules.reconstruction import (
    BudgetExceeded,
    count_matching_samples,
    count_unique_samples,
    matching_frequency_bounds,
    reconstruction_findings,
    round_half_even,
    round_sqrt_half_even,
)


def _typical_sample(k: int, n: int, seed: int) -> list[int]:
    """A unimodal Likert-like sample: binomial around the scale's middle."""
    rng = np.random.default_rng(seed)
    return [int(v) + 1 for v in rng.binomial(k - 1, 0.55, size=n)]


def _wide_sample(k: int, n: int, seed: int) -> list[int]:
    """A sample spread evenly over the whole scale (the hardest case for counting)."""
    rng = np.random.default_rng(seed)
    return [int(v) for v in rng.integers(1, k + 1, size=n)]


def _released(x: list[int], d: int) -> tuple[str, str]:
    n, s, q = len(x), sum(x), sum(v * v for v in x)
    mean = round_half_even(Fraction(s, n), d)
    sd = round_sqrt_half_even(Fraction(n * q - s * s, n * (n - 1)), d)
    return f"{float(mean):.{d}f}", f"{float(sd):.{d}f}"


def table_k5() -> None:
    t0 = time.perf_counter()
    for n in range(3, 13):
        count_unique_samples(5, n, "mean_sd")
        for d in (2, 1):
            count_unique_samples(5, n, "mean_sd", precision=d)
        for qtype in (6, 7, 2):
            count_unique_samples(5, n, "median_quartiles", quantile_type=qtype)
        count_unique_samples(5, n, "median_min_max")
    print(f"k=5 table, n=3..12, all 8 columns: {time.perf_counter() - t0:.2f} s")


def matching_counts(budget_steps: int) -> None:
    for shape, draw in (("typical", _typical_sample), ("uniform", _wide_sample)):
        for k in (7, 10):
            for n in (10, 100, 1000):
                _one_count(shape, k, n, draw(k, n, n + k), budget_steps)
    # where the shell method's tables reach their size limit (see docs/reconstruction.md)
    for n in (1500, 3000):
        _one_count("uniform", 10, n, _wide_sample(10, n, n + 10), budget_steps)


def _one_count(shape: str, k: int, n: int, x: list[int], budget_steps: int) -> None:
    mean, sd = _released(x, 2)
    t0 = time.perf_counter()
    try:
        count = count_matching_samples(k, n, mean, sd, 2, max_steps=budget_steps)
        result = f"{count} samples"
    except BudgetExceeded:
        result = f"over budget ({budget_steps} steps)"
    elapsed = time.perf_counter() - t0
    print(
        f"count_matching_samples {shape:<7} k={k:2d} n={n:4d} mean={mean} sd={sd}: "
        f"{result}, {elapsed:.3f} s"
    )


def bounds_timings(budget_steps: int) -> None:
    for shape, draw in (("typical", _typical_sample), ("uniform", _wide_sample)):
        for k, n in ((7, 100), (10, 100), (7, 1000)):
            mean, sd = _released(draw(k, n, n + k), 2)
            t0 = time.perf_counter()
            try:
                bounds = matching_frequency_bounds(k, n, mean, sd, 2, max_steps=budget_steps)
                result = f"{sum(lo == hi for lo, hi in bounds.values())} values pinned"
            except BudgetExceeded:
                result = f"over budget ({budget_steps} steps)"
            elapsed = time.perf_counter() - t0
            print(
                f"matching_frequency_bounds {shape:<7} k={k:2d} n={n:4d} mean={mean} sd={sd}: "
                f"{result}, {elapsed:.3f} s"
            )


def _output(x: list[int], k: int, d: int) -> SummaryOutput:
    mean, sd = _released(x, d)
    counts = Counter(x)
    n = len(x)
    return SummaryOutput(
        by=[],
        statistics=["mean", "sd"],
        round=d,
        groups=[
            SummaryGroup(
                labels=[],
                variables=[
                    VariableSummary(
                        variable="score", n=n, stats={"mean": float(mean), "sd": float(sd)}
                    )
                ],
            )
        ],
        facts=SummaryFacts(
            groups=[
                SummaryGroupFacts(
                    labels=[],
                    n=n,
                    variables={
                        "score": SummaryVariableFacts(
                            n=n,
                            n_distinct=len(counts),
                            scale=(1, k),
                            value_counts={str(v): counts.get(v, 0) for v in range(1, k + 1)},
                        )
                    },
                )
            ],
            n_total=n,
        ),
    )


def check_timings() -> None:
    rules = SimpleNamespace(threshold=10)
    for k in (5, 7, 10):
        for n in (10, 30, 100, 1000, 10000):
            out = _output(_typical_sample(k, n, seed=3 * n + k), k, 2)
            t0 = time.perf_counter()
            findings = reconstruction_findings(out, rules, [])
            elapsed = time.perf_counter() - t0
            verdicts = ",".join(f.verdict for f in findings) or "release"
            print(f"check k={k:2d} n={n:5d}: {verdicts:<20} {elapsed:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget", type=int, default=5_000_000, help="max DP steps per count")
    args = parser.parse_args()
    table_k5()
    matching_counts(args.budget)
    bounds_timings(args.budget)
    check_timings()


if __name__ == "__main__":
    main()
