"""Compare our exact GCAP with SDMetrics' CategoricalGeneralizedCAP on the CMC rows.

SDMetrics is never a dependency of ours (one of its dependencies is BUSL-licensed): run this in a
throwaway venv outside the repository that has `sdmetrics` (plus `pydantic` and `pyyaml` for our
package) installed, with our `rules` package on the path:

    python3 -m venv <venv> && <venv>/bin/pip install sdmetrics pydantic pyyaml
    PYTHONPATH=rules/src <venv>/bin/python benchmarks/gcap_vs_sdmetrics.py

SDMetrics' score is 1 - (mean over real records of the share of the true target among all
synthetic records at the smallest Hamming distance over the keys); ours (`gcap` then
`attack_summary(...).gcap_mean_score`) is that mean share, so the two should add up to 1. The
releases compared: the identity (S = O), an independent-marginals sample (each column of O
permuted on its own) and a perturbed copy (each cell redrawn uniformly with probability 0.3).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
from sdmetrics.single_table import CategoricalGeneralizedCAP

from safeaccess.rules.synthetic import attack_summary, gcap

CMC = Path(__file__).resolve().parents[1] / "tests" / "vectors" / "cmc" / "contraceptive.csv"
NAMES = ["age", "wedu", "hedu", "children", "religion", "working", "hocc", "sol", "media", "method"]
# (key columns, target column): the two scenarios of the GCAP paper's CMC tables and a short one
CASES = [
    (["age", "wedu", "hedu", "children", "religion", "working", "hocc"], "method"),
    (["age", "wedu", "children", "religion", "working"], "hedu"),
    (["age", "wedu"], "method"),
]


def releases(codes: np.ndarray, levels: list[int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    independent = np.stack([rng.permutation(codes[:, c]) for c in range(codes.shape[1])], axis=1)
    redraw = rng.random(codes.shape) < 0.3
    fresh = np.stack([rng.integers(0, lv, codes.shape[0]) for lv in levels], axis=1)
    return {
        "identity": codes.copy(),
        "independent marginals": independent,
        "perturbed copy (30 % of cells)": np.where(redraw, fresh, codes),
    }


def main() -> None:
    raw = np.loadtxt(CMC, delimiter=",", comments="#", dtype=np.int64)
    cols, levels = [], []
    for c in range(raw.shape[1]):
        values, inverse = np.unique(raw[:, c], return_inverse=True)
        cols.append(inverse)
        levels.append(len(values))
    codes = np.stack(cols, axis=1)
    real_df = pd.DataFrame(codes.astype(str), columns=NAMES)
    print("release | keys -> target | SDMetrics | 1 - ours | |difference| | seconds (SDM / ours)")
    for rel_name, syn in releases(codes, levels).items():
        syn_df = pd.DataFrame(syn.astype(str), columns=NAMES)
        for keys, target in CASES:
            k = [NAMES.index(c) for c in keys]
            t = NAMES.index(target)
            start = time.perf_counter()
            theirs = CategoricalGeneralizedCAP.compute(
                real_df, syn_df, key_fields=keys, sensitive_fields=[target]
            )
            t_sdm = time.perf_counter() - start
            start = time.perf_counter()
            counts, rho = gcap(
                codes[:, k], codes[:, t], syn[:, k], syn[:, t], [levels[i] for i in k], levels[t]
            )
            ours = (
                1.0 - attack_summary(counts, rho, codes[:, t], syn[:, t], levels[t]).gcap_mean_score
            )
            t_ours = time.perf_counter() - start
            print(
                f"{rel_name} | {len(keys)} keys -> {target} | {theirs:.6f} | {ours:.6f} | "
                f"{abs(theirs - ours):.1e} | {t_sdm:.1f} / {t_ours:.3f}"
            )


if __name__ == "__main__":
    main()
