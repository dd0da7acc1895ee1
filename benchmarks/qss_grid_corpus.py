"""An ordinary research corpus through the server's admission, with the data-revealed-zero rule.

Six researchers in one project scope ask 22 ordinary outputs of the demo census (overlapping
frequency tables and crosstabs, magnitude tables, grouped summaries, histograms with declared
edges, regressions, a correlation and a t-test, with filters people write: `age >= 18`,
`employment == 'employed'`, `income > 0`). Each output is computed with the runner's code and
admitted through `qss_gate.gate` exactly as a step is (populations first, state carried through
the state file's envelope), with every rule check taken as passed, so only the auditor decides.
The scope reserves the census's standard one- and two-way tables after the population, as the
server does (`--no-reserve`: without them, as before issue 41). Prints the fraction released,
and per output the admission time (wall, and this process's CPU) and the grid check's time.

    python benchmarks/qss_grid_corpus.py --rows 200000

`--missing F` blanks the income of a random fraction F of the people (issue 41: the summaries'
n against their suppressed missing counts); every output then goes through the missing-count
suppression the server applies before the auditor (`rules.missing.suppress_small_missing`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pandas as pd

from safeaccess.client.analyses import (
    Analysis,
    Correlation,
    FrequencyTable,
    Histogram,
    MagnitudeTable,
    Regression,
    StatTest,
    Summary,
)
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.decision import Decision
from safeaccess.rules.missing import suppress_small_missing
from safeaccess.rules.qss import AuditMode, AuditPolicy, AuditState
from safeaccess.rules.ruleset import DEFAULT_RULESET
from safeaccess.sandbox.runner import execute
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.qss.gate import Gate, gate
from safeaccess.server.qss.reserved import reserved_tables
from safeaccess.server.qss.universe import Population, ScopeState, admit_populations, decode, encode

AGE_EDGES = [16.0, 25.0, 35.0, 45.0, 55.0, 65.0, 75.0, 96.0]
INCOME_EDGES = [0.0, 20_000.0, 40_000.0, 60_000.0, 100_000.0, 2_000_000.0]


def corpus() -> list[tuple[str, Analysis]]:
    """(researcher, output) in the order they are asked."""
    return [
        ("ada", FrequencyTable(rows=["region"], cols=["sex"])),
        ("ada", FrequencyTable(rows=["ethnicity"], cols=["sex"])),
        ("ada", Summary(variables=["income"], by=["sex"])),
        ("ada", Regression(formula="income ~ age + C(sex)", where="age >= 18")),
        ("bob", Histogram(variable="age", edges=AGE_EDGES)),
        ("bob", FrequencyTable(rows=["health"])),
        ("bob", FrequencyTable(rows=["region"], where="employment == 'employed'")),
        ("bob", MagnitudeTable(value="income", agg="mean", rows=["region"])),
        ("cem", FrequencyTable(rows=["sex"], cols=["health"])),
        ("cem", Regression(formula="income ~ age + C(region)", where="income > 0")),
        ("cem", Summary(variables=["income", "age"], by=["employment"])),
        ("dee", FrequencyTable(rows=["employment"], cols=["sex"])),
        ("dee", Histogram(variable="income", edges=INCOME_EDGES, where="age >= 18")),
        ("dee", Correlation(variables=["age", "income", "health"])),
        # few-valued regressors (issue 41): age over the oldest (6 and 8 values), admitted as
        # weighted rows over its value groups
        ("dee", Regression(formula="income ~ age", where="age >= 90")),
        ("eve", Regression(formula="income ~ log1p(age) + C(sex)", where="age >= 88")),
        ("eve", StatTest(test="t_two_sample", variable="income", group="sex")),
        ("eve", FrequencyTable(rows=["region"], cols=["health"], where="employment == 'employed'")),
        ("eve", MagnitudeTable(value="income", agg="sum", rows=["sex"], cols=["employment"])),
        ("fay", Summary(variables=["income"], by=["region"], where="employment == 'employed'")),
        ("fay", Regression(formula="income ~ C(health) + C(sex)")),
        ("fay", FrequencyTable(rows=["region"], cols=["sex"])),
    ]


#: The facts of the last `run_corpus`'s population and reserved tables, with their CPU time.
RESERVATION: dict[str, object] = {}

RELEASE = Decision(verdict="release", findings=[], ruleset="corpus", ruleset_hash="0" * 64)


def run_corpus(
    frame: pd.DataFrame, metadata: DatasetMetadata, k: int = 10, *, reserve: bool = True
) -> list[tuple[str, Analysis, Gate, float]]:
    """Each output of `corpus()` admitted in turn; (researcher, output, gate, seconds)."""
    n = len(frame)
    policy = AuditPolicy(mode=AuditMode.SPAN, k=k)
    tables = reserved_tables(frame, metadata) if reserve else []
    cpu = time.process_time()
    scope, facts = admit_populations(
        ScopeState(AuditState.empty(n)), [Population.of(1, np.arange(n), tables)], policy
    )
    RESERVATION.update(facts, cpu_ms=(time.process_time() - cpu) * 1000)
    results = []
    for who, analysis in corpus():
        # as the server does before the auditor (the census has no missing values unless
        # `--missing` blanks some: then small missing counts are suppressed)
        output = suppress_small_missing(execute(analysis, frame, metadata), DEFAULT_RULESET)
        started, cpu = time.perf_counter(), time.process_time()
        result = gate(
            output,
            RELEASE,
            ids=np.arange(n),
            state=scope.state,
            policy=policy,
            scope="project",
            analysis=analysis.model_dump(mode="json"),
            metadata=metadata,
            origins=scope.origins,
        )
        if result.state is not None and result.origin is not None:
            origins = {**scope.origins, result.origin[0]: result.origin[1]}
            kept = ScopeState(result.state, scope.populations, origins, scope.reserved)
            scope = decode(encode(kept))
        result.facts["cpu_ms"] = (time.process_time() - cpu) * 1000  # this process's CPU
        results.append((who, analysis, result, time.perf_counter() - started))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument(
        "--no-reserve", action="store_true", help="reserve no standard table (before issue 41)"
    )
    parser.add_argument(
        "--missing", type=float, default=0.0, help="blank this fraction of the incomes"
    )
    args = parser.parse_args()
    frame = generate_census(args.rows)
    if args.missing > 0:
        blank = np.random.default_rng(41).random(len(frame)) < args.missing
        frame["income"] = frame["income"].astype("float64").mask(blank)
    results = run_corpus(frame, census_metadata(), reserve=not args.no_reserve)
    released = sum(r.decision.verdict == "release" for _, _, r, _ in results)
    missing = f", {args.missing:.1%} of incomes missing" if args.missing > 0 else ""
    print(f"rows {args.rows}{missing}: {released}/{len(results)} released")
    print(
        f"reservation: {RESERVATION.get('tables_reserved', [])} reserved, "
        f"{RESERVATION.get('tables_skipped', [])} skipped, "
        f"{RESERVATION.get('tables_refused', [])} refused, "
        f"{float(RESERVATION['cpu_ms']):.1f} ms CPU with the population"
    )
    for who, analysis, result, seconds in results:
        facts = result.facts
        # the certificate's verdict and branches: a refusal for cost is `toocostly`
        certificate = facts.get("certificate") or {}
        verdict = f"{certificate.get('verdict', '-')}/{certificate.get('nodes', '-')}"
        print(
            f"  {who} {analysis.kind:16s} {result.decision.verdict:8s} admit {seconds * 1000:8.1f} ms"
            f" ({facts['cpu_ms']:7.1f} ms CPU)  certificate {verdict:14s}"
            f"  grid {facts.get('grid_ms', 0):7.1f} ms  dependencies {facts.get('dependencies', 0)}"
            f"  zero {facts.get('data_revealed_zero', False)}"
        )
    grid = [float(r.facts.get("grid_ms", 0.0)) for _, _, r, _ in results]
    admit_ms = [s * 1000 for *_, s in results]
    cpu_ms = [float(r.facts["cpu_ms"]) for _, _, r, _ in results]
    print(
        f"admission CPU median {statistics.median(cpu_ms):.1f} ms, max {max(cpu_ms):.1f} ms, "
        f"total {sum(cpu_ms) / 1000:.2f} s"
    )
    print(
        f"admission median {statistics.median(admit_ms):.1f} ms, max {max(admit_ms):.1f} ms; "
        f"grid check median {statistics.median(grid):.1f} ms, max {max(grid):.1f} ms"
    )


if __name__ == "__main__":
    main()
