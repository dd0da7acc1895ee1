"""The runner's cost of a fit's query sets with X'X's cross terms (issue 41).

Fits main-effects models on the demo census with the runner's own `execute` and prints the CPU
time (best of `--repeat`) and the number of extra query sets the fit sends the auditor. Run it
on the code before and after a change to the sub-group sets to compare (the fit itself, by
statsmodels, is most of the time).

    python benchmarks/regression_cross_terms.py --rows 1000000
"""

from __future__ import annotations

import argparse
import time

from safeaccess.client.analyses import Regression
from safeaccess.rules.outputs import RegressionOutput
from safeaccess.sandbox.runner import execute
from safeaccess.server.demo.data import census_metadata, generate_census

FORMULAS = [
    "income ~ C(region) + C(sex) + C(ethnicity) + age",
    "income ~ C(region) + C(health) + C(sex)",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    frame = generate_census(args.rows)
    metadata = census_metadata()
    for formula in FORMULAS:
        times = []
        sets = 0
        for _ in range(args.repeat):
            started = time.process_time()
            output = execute(Regression(formula=formula), frame, metadata)
            times.append(time.process_time() - started)
            assert isinstance(output, RegressionOutput)
            sets = len(output.facts.extra_query_sets)
        print(f"{args.rows} rows  {formula}: {min(times):.2f} s CPU, {sets} extra query sets")


if __name__ == "__main__":
    main()
