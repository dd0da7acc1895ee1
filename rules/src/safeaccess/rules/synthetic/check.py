"""All disclosure checks of one synthetic release, and the verdict of the `synth_*` rules.

What the sandbox's check job runs: the attack family per target and key set, synthpop's measures
on the full key set, reproduced full-row uniques, DCR / y-privacy, sampled (y,p)-coverage at
y = the 5 % quantile of the real LOO distances, and p-privacy over S's dependency cliques.
Every number is a fact about the real data, for checkers and the audit log only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from numpy.typing import ArrayLike

from safeaccess.rules.synthetic.attack import AttackRow, attack_check
from safeaccess.rules.synthetic.coding import coded_matrix, levels_checked
from safeaccess.rules.synthetic.coverage import SampledCoverage, yp_coverage_sampled
from safeaccess.rules.synthetic.decision import SynthRules, SynthVerdict, decide
from safeaccess.rules.synthetic.distance import DcrReport, as_features, dcr_report, hamming_dcr
from safeaccess.rules.synthetic.errors import SyntheticCheckError
from safeaccess.rules.synthetic.pprivacy import dependency_cliques, p_privacy
from safeaccess.rules.synthetic.synthpop import (
    ReproducedUniques,
    SynthpopMeasures,
    UniquesExcess,
    reproduced_uniques,
    synthpop_measures,
    uniques_excess,
)


@dataclass(frozen=True)
class PPrivacy:
    tau: float
    cliques: tuple[tuple[int, ...], ...]
    f_size: int
    xi: int
    p: float


@dataclass(frozen=True)
class CheckFacts:
    """The facts of every check (§5.4 of the design)."""

    attack: tuple[AttackRow, ...]
    synthpop: dict[int, SynthpopMeasures]  # per target, on all its keys
    reproduced: ReproducedUniques
    uniques: UniquesExcess  # reproduced full-row uniques against the split-half reference
    dcr: DcrReport
    coverage: SampledCoverage
    p_privacy: PPrivacy


def run_checks(
    real: ArrayLike,
    syn: ArrayLike,
    levels: Sequence[int],
    keys: Sequence[int],
    targets: Sequence[int],
    *,
    real_features: ArrayLike,
    syn_features: ArrayLike,
    rules: SynthRules | None = None,
    categorical: Sequence[bool] | None = None,
    seed: int = 0,
    one_hot: bool = False,
) -> CheckFacts:
    """Run every check on coded `real` and `syn` (records x columns, column i in
    0..levels[i]-1) and their distance features (`distance_features`). `categorical[i]` says
    which columns take Cramer's V in the dependency graph (default: all categorical).
    `one_hot` says that the features are the one-hot features of every column's codes: DCR is
    then the exact Hamming search on all records (`hamming_dcr`)."""
    r = rules or SynthRules()
    lv = levels_checked(levels)
    o = coded_matrix(real, lv, "real")
    s = coded_matrix(syn, lv, "syn")
    fo, fs = as_features(real_features, "real_features"), as_features(syn_features, "syn_features")
    if fo.shape[0] != o.shape[0] or fs.shape[0] != s.shape[0]:
        raise SyntheticCheckError("the distance features must have one row per record")
    attack = attack_check(o, s, lv, keys, targets, max_keysets=r.synth_max_keysets, seed=seed)
    sp = {}
    for t in dict.fromkeys(int(t) for t in targets):
        cols = [int(k) for k in keys if int(k) != t]
        sp[t] = synthpop_measures(o[:, cols], o[:, t], s[:, cols], s[:, t])
    exact = hamming_dcr(s, o, lv) if one_hot else None
    dcr = dcr_report(fs, fo, seed=seed, distances=exact)
    if isinstance(r.synth_yp_y, str):
        if r.synth_yp_y != "loo_q05":
            raise SyntheticCheckError(
                f"synth_yp_y must be 'loo_q05' or a distance, got {r.synth_yp_y!r}"
            )
        y = dcr.threshold
    else:
        y = float(r.synth_yp_y)
    coverage = yp_coverage_sampled(
        fo,
        fs,
        y,
        r.synth_yp_p,
        m=r.synth_hungarian_max,
        seed=seed,
        nearest=exact[0] if exact is not None else None,
    )
    cat = [True] * len(lv) if categorical is None else list(categorical)
    cliques = dependency_cliques(s, r.synth_p_privacy_tau, categorical=cat)
    f_size, xi, p = p_privacy(o, s, cliques)
    return CheckFacts(
        attack=tuple(attack),
        synthpop=sp,
        reproduced=reproduced_uniques(o, s),
        uniques=uniques_excess(o, s, seed=seed),
        dcr=dcr,
        coverage=coverage,
        p_privacy=PPrivacy(r.synth_p_privacy_tau, tuple(cliques), f_size, xi, p),
    )


def verdict(facts: CheckFacts, rules: SynthRules | None = None) -> SynthVerdict:
    """The `synth_*` rules applied to the facts of `run_checks`."""
    return decide(
        rules or SynthRules(),
        attack=facts.attack,
        uniques=facts.uniques,
        dcr=facts.dcr,
        coverage=facts.coverage,
    )
