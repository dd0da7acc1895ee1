"""The cost of the standard tables a scope reserves after a version's population
(`server/qss/reserved.py`): computing them from the demo census and admitting them into a new
scope after its population, as the server does at a scope's first admission. Prints CPU and wall
times, how many were admitted or refused, and the state's rank and atoms.

    python benchmarks/qss_reserved.py --rows 200000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from safeaccess.rules.qss import AuditPolicy, AuditState
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.qss.reserved import reserved_tables
from safeaccess.server.qss.universe import Population, ScopeState, admit_populations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    if args.rows < 1 or args.k < 2:
        parser.error("--rows must be at least 1 and --k at least 2")
    frame = generate_census(args.rows)
    metadata = census_metadata("census")
    cpu, wall = time.process_time(), time.perf_counter()
    tables = reserved_tables(frame, metadata)
    print(
        f"rows {args.rows}: {len(tables)} tables computed in "
        f"{time.process_time() - cpu:.2f} s CPU ({time.perf_counter() - wall:.2f} s wall)"
    )
    population = Population.of(1, np.arange(args.rows), tables)
    cpu, wall = time.process_time(), time.perf_counter()
    scope, facts = admit_populations(
        ScopeState(AuditState.empty(args.rows)), [population], AuditPolicy(k=args.k)
    )
    print(
        f"admitted after the population in {time.process_time() - cpu:.2f} s CPU "
        f"({time.perf_counter() - wall:.2f} s wall): "
        f"{len(facts.get('tables_reserved', []))} reserved, "
        f"skipped {facts.get('tables_skipped', [])}, refused {facts.get('tables_refused', [])}; "
        f"rank {scope.state.n_constraints}, atoms {scope.state.n_atoms}"
    )


if __name__ == "__main__":
    main()
