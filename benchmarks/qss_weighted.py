"""What weighted rows cost the query-set admission (issue 41), next to the 0/1 rows they replace.

On the rules-level census of `benchmarks/qss.py` (200 000 records; after its ordinary corpus of
19 outputs, about 192 000 atoms below k), a fit on `household` (8 values) restricted to the
adults is admitted in two ways: as the 0/1 rows of its value groups (the rule before issue 41)
and as its weighted rows (the column and its square over the groups). Then the corpus is asked
again on fresh filters against each state, so the figures show what the weighted constraints
cost every later admission (their certificate carried as weighted columns). Prints the CPU
time of each admission (this process's CPU), the medians and the ratio weighted / 0/1.

    python benchmarks/qss_weighted.py [--records 200000]
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
from safeaccess.rules.qss import AuditPolicy, AuditState, WeightedSet, admit


def timed(state: AuditState, arrays: list[np.ndarray], policy: AuditPolicy, weighted=()):  # type: ignore[no-untyped-def]
    started = time.process_time()
    result = admit(state, arrays, policy, weighted)
    return result, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args()
    policy = AuditPolicy(k=rules_corpus.K)
    data = rules_corpus.census(args.records, args.seed)
    n = args.records
    print(f"k={policy.k}, {n:,} records, load average {os.getloadavg()[0]:.1f}")
    base = admit(AuditState.empty(n), [np.zeros(n, dtype=np.int8)], policy).state
    assert base is not None
    for out in rules_corpus.corpus(data, args.seed):
        result = admit(base, out.arrays, policy)
        if result.state is not None:
            base = result.state
    print(f"after the corpus: {base.n_atoms:,} atoms, rank {base.n_constraints}")
    adults = data["age"] >= 18
    model = np.where(adults, 0, -1).astype(np.int8)
    groups = np.where(adults, data["household"], -1).astype(np.int8)
    values = np.arange(8, dtype=np.float64) + 1.0
    plain, plain_cpu = timed(base, [model, groups], policy)
    weighted_set = WeightedSet(groups, np.stack([values, values * values]))
    weighted, weighted_cpu = timed(base, [model], policy, [weighted_set])
    print(
        f"the fit: 0/1 groups {'released' if plain.admitted else 'refused'} "
        f"{plain_cpu * 1000:.1f} ms CPU; weighted rows "
        f"{'released' if weighted.admitted else 'refused'} {weighted_cpu * 1000:.1f} ms CPU "
        f"(ratio {weighted_cpu / plain_cpu:.2f})"
    )
    if plain.state is None or weighted.state is None:
        print(f"  0/1: {plain.reason}\n  weighted: {weighted.reason}")
        return
    figures = {}
    for name, state in (("0/1", plain.state), ("weighted", weighted.state)):
        cpus = []
        released = total = 0
        for out in rules_corpus.corpus(data, args.seed + 1):
            result, cpu = timed(state, out.arrays, policy)
            cpus.append(cpu)
            total += 1
            if result.state is not None:
                state = result.state
                released += 1
        figures[name] = float(np.median(cpus))
        print(
            f"later corpus on the {name} state: released {released}/{total}; CPU median "
            f"{np.median(cpus) * 1000:.1f} ms, max {max(cpus) * 1000:.1f} ms"
        )
    print(
        f"later admissions, median ratio weighted / 0/1: {figures['weighted'] / figures['0/1']:.2f}"
    )


if __name__ == "__main__":
    main()
