"""The query-set admission's worst cases next to ordinary research (issue 41 §1), at 200 000
records: every admission within 10 s of CPU, ordinary ones unchanged.

Workloads (CPU is this process's CPU time per admission; wall times depend on the load):

- `ordinary`: the ordinary corpus of `qss_grid_corpus.py` (22 outputs of six researchers on the
  demo census, through `qss_gate.gate` with the grid check, as a step is admitted), then the
  rules-level corpus of `qss.py` (19 outputs, 192 000 atoms below k): what must stay released.
- `in_list`: after the ordinary corpus, `frequency_table("sex", where="income in (...)")` with
  25, 50 and 100 values (100 is the plan-time limit, `client/grammar/limits.py`), and the
  plan-time refusal of 101.
- `deep`: two one-way tables over a sub-population of 2 250 of the 200 000 records whose cells
  hold 15 records each and whose cross cells one or two (the smallest determined combination is
  a table cell: safe, but no certificate of disjoint completing sets exists, so the exact search
  runs until its operation budget: `rules/qss/guard.py`). Before the bound this admission ran
  for more than 5 minutes.

- `survey`: issue 41's own report on the demo census at `--survey-rows` (20 000): the scope
  reserves the standard tables (the server's default), the 20 ordinary outputs of
  `qss_grid_corpus.py` are admitted, then `frequency_table("health", "age", where="region ==
  'West' and sex == 'F'", suppress=True)` (the report's `diagnosis` is the census' `health`),
  mitigated as the server releases it, then a colleague's `frequency_table("sex")`. Before the
  bound the report's step ran for more than 15 minutes. `--no-reserve`: the scope without the
  reserved tables.

Run: python benchmarks/qss_worst_case.py [--rows 200000]
         [--workloads ordinary,in_list,deep,survey] [--survey-rows 20000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import qss as rules_corpus
from qss_grid_corpus import RELEASE, corpus
from safeaccess.client.analyses import FrequencyTable, Mitigations
from safeaccess.client.grammar.limits import MAX_FILTER_VALUES
from safeaccess.client.validation import AnalysisInvalid, validate
from safeaccess.rules.qss import AuditMode, AuditPolicy, AuditState, admit
from safeaccess.sandbox.runner import execute
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.qss.gate import gate
from safeaccess.server.qss.universe import (
    Population,
    ScopeState,
    admit_populations,
    decode,
    encode,
)

K = 10


def ordinary_and_in_lists(rows: int, in_lists: bool) -> None:
    frame = generate_census(rows)
    metadata = census_metadata()
    policy = AuditPolicy(mode=AuditMode.SPAN, k=K)
    scope, _ = admit_populations(
        ScopeState(AuditState.empty(rows)), [Population.of(1, np.arange(rows))], policy
    )

    def admitted(analysis: FrequencyTable | object) -> tuple[str, float, float, str]:
        nonlocal scope
        output = execute(analysis, frame, metadata)  # type: ignore[arg-type]
        w0, c0 = time.perf_counter(), time.process_time()
        result = gate(
            output,
            RELEASE,
            ids=np.arange(rows),
            state=scope.state,
            policy=policy,
            scope="project",
            analysis=analysis.model_dump(mode="json"),  # type: ignore[attr-defined]
            metadata=metadata,
            origins=scope.origins,
        )
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        if result.state is not None and result.origin is not None:
            origins = {**scope.origins, result.origin[0]: result.origin[1]}
            scope = decode(encode(ScopeState(result.state, scope.populations, origins)))
        cert = result.facts.get("certificate", {})
        return result.decision.verdict, cpu, wall, str(cert.get("verdict", "-"))

    cpus = []
    released = 0
    for who, analysis in corpus():
        verdict, cpu, wall, cert = admitted(analysis)
        cpus.append(cpu)
        released += verdict == "release"
        print(f"  ordinary {who:6s} {analysis.kind:16s} {verdict:8s} CPU {cpu * 1000:8.1f} ms")
    print(
        f"ordinary (server gate, {rows:,} records): released {released}/{len(cpus)}; admission "
        f"CPU median {np.median(cpus) * 1000:.1f} ms, max {max(cpus) * 1000:.1f} ms"
    )
    if not in_lists:
        return
    incomes = np.unique(frame["income"].to_numpy())
    rng = np.random.default_rng(41)
    for n in (25, 50, MAX_FILTER_VALUES):
        values = ", ".join(f"{v:g}" for v in rng.choice(incomes, n, replace=False))
        analysis = FrequencyTable(rows=["sex"], where=f"income in ({values})")
        validate(analysis, metadata)
        verdict, cpu, wall, cert = admitted(analysis)
        print(
            f"in_list: {n:4d} values: {verdict:8s} admission CPU {cpu:.2f} s, wall {wall:.2f} s "
            f"(certificate: {cert})"
        )
    values = ", ".join(f"{v:g}" for v in incomes[: MAX_FILTER_VALUES + 1])
    try:
        validate(FrequencyTable(rows=["sex"], where=f"income in ({values})"), metadata)
        print(f"in_list: {MAX_FILTER_VALUES + 1} values: NOT refused at plan time")
    except AnalysisInvalid as exc:
        print(f"in_list: {MAX_FILTER_VALUES + 1} values: refused at plan time: {exc}")


def deep(rows: int, per: int = 15, levels: int = 150) -> None:
    sub = per * levels
    rng = np.random.default_rng(1)
    a = np.full(rows, -1, np.int32)
    b = np.full(rows, -1, np.int32)
    chosen = rng.choice(rows, sub, replace=False)
    a[chosen] = np.arange(sub) // per
    b[chosen] = rng.permutation(sub) // per
    policy = AuditPolicy(k=K)
    state = AuditState.empty(rows)
    for name, array in (("universe", np.zeros(rows, np.int8)), ("table a", a), ("table b", b)):
        w0, c0 = time.perf_counter(), time.process_time()
        result = admit(state, [array], policy)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        cert = result.facts.get("certificate", {})
        print(
            f"deep ({rows:,} records, {sub} in the tables): {name:8s} "
            f"{'released' if result.admitted else 'refused '} CPU {cpu:.2f} s, wall {wall:.2f} s"
            f" certificate {cert}"
        )
        if result.admitted and result.state is not None:
            state = result.state


def survey(rows: int, reserve: bool = True) -> None:
    from qss_grid_corpus import corpus as ordinary_corpus
    from safeaccess.rules.ruleset import DEFAULT_RULESET
    from safeaccess.sandbox.release import mitigate_output
    from safeaccess.server.qss.reserved import reserved_tables

    frame = generate_census(rows)
    metadata = census_metadata()
    policy = AuditPolicy(mode=AuditMode.SPAN, k=K)
    c0 = time.process_time()
    tables = reserved_tables(frame, metadata) if reserve else []
    scope, facts = admit_populations(
        ScopeState(AuditState.empty(rows)), [Population.of(1, np.arange(rows), tables)], policy
    )
    print(
        f"survey ({rows:,} records): {len(tables)} standard tables computed, "
        f"{len(facts.get('tables_reserved', []))} reserved, skipped "
        f"{facts.get('tables_skipped', [])}, refused {facts.get('tables_refused', [])}, "
        f"CPU {time.process_time() - c0:.2f} s"
    )
    steps: list[tuple[str, object]] = [*ordinary_corpus()]
    steps.append(
        (
            "report",
            FrequencyTable(
                rows=["health"],
                cols=["age"],
                where="region == 'West' and sex == 'F'",
                mitigations=Mitigations(suppress=True),
            ),
        )
    )
    steps.append(("colleague", FrequencyTable(rows=["sex"])))
    cpus = []
    released = 0
    for who, analysis in steps:
        output = mitigate_output(
            execute(analysis, frame, metadata),  # type: ignore[arg-type]
            analysis,  # type: ignore[arg-type]
            DEFAULT_RULESET,
        )
        w0, c0 = time.perf_counter(), time.process_time()
        result = gate(
            output,
            RELEASE,
            ids=np.arange(rows),
            state=scope.state,
            policy=policy,
            scope="project",
            analysis=analysis.model_dump(mode="json"),  # type: ignore[attr-defined]
            metadata=metadata,
            origins=scope.origins,
        )
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        if result.state is not None and result.origin is not None:
            origins = {**scope.origins, result.origin[0]: result.origin[1]}
            scope = decode(encode(ScopeState(result.state, scope.populations, origins)))
        verdict = result.decision.verdict
        if who not in ("report", "colleague"):
            cpus.append(cpu)
            released += verdict == "release"
            continue
        cert = result.facts.get("certificate", {})
        print(
            f"survey: {who:9s} {verdict:8s} admission CPU {cpu:.2f} s, wall {wall:.2f} s "
            f"(certificate: {cert.get('verdict', '-')})"
        )
    print(
        f"survey: ordinary corpus released {released}/{len(cpus)}, admission CPU median "
        f"{np.median(cpus) * 1000:.0f} ms, max {max(cpus) * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workloads", default="ordinary,in_list,deep,survey")
    parser.add_argument("--survey-rows", type=int, default=20_000)
    parser.add_argument(
        "--no-reserve", action="store_true", help="survey: without the reserved standard tables"
    )
    args = parser.parse_args()
    wanted = set(args.workloads.split(","))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if "survey" in wanted:
        survey(args.survey_rows, reserve=not args.no_reserve)
    if "deep" in wanted:
        deep(args.rows)
    if wanted & {"ordinary", "in_list"}:
        ordinary_and_in_lists(args.rows, "in_list" in wanted)
    if "ordinary" in wanted:
        data = rules_corpus.census(args.rows, 20)
        tally = rules_corpus.run(
            "rules-level corpus", data, rules_corpus.corpus(data, 20), verbose=False
        )
        print(f"rules-level corpus: admission CPU max {max(tally.cpu):.2f} s")


if __name__ == "__main__":
    main()
