"""Disclosure checks of synthetic data against the real records (run in the sandbox; facts only).

Attribute disclosure (Hittmeir et al.): `gcap`, `gcap_loo`, `predict`, `attack_summary`,
`attack_check`. Identity (synthpop): `synthpop_measures`, `reproduced_uniques`. Distances (Chen
et al.): `dcr`, `dcr_loo`, `dcr_report`, `yp_coverage`, `p_privacy`, `dependency_cliques`,
`statistical_error`. DP accounting of the synthesiser's workload: `noisy_total`, `workload_mu`,
`mst_sigmas`, and the MST-G tree choice: `pair_scores`, `max_spanning_tree`. The `synth_*` rules: `SynthRules`, `decide`. Everything at once: `run_checks`, `verdict`.

Inputs are level-coded integer arrays (or scaled features for the distance checks).
"""

from __future__ import annotations

from safeaccess.rules.synthetic.accounting import mst_sigmas, noisy_total, workload_mu
from safeaccess.rules.synthetic.attack import (
    AttackRow,
    Interval,
    attack_check,
    key_sets,
    paired_bootstrap,
)
from safeaccess.rules.synthetic.check import CheckFacts, PPrivacy, run_checks, verdict
from safeaccess.rules.synthetic.coverage import (
    Coverage,
    SampledCoverage,
    yp_coverage,
    yp_coverage_sampled,
)
from safeaccess.rules.synthetic.decision import RuleOutcome, SynthRules, SynthVerdict, decide
from safeaccess.rules.synthetic.distance import (
    DcrReport,
    dcr,
    dcr_loo,
    dcr_report,
    distance_features,
)
from safeaccess.rules.synthetic.errors import SyntheticCheckError
from safeaccess.rules.synthetic.gcap import gcap, gcap_loo, predict
from safeaccess.rules.synthetic.pprivacy import dependency_cliques, p_privacy
from safeaccess.rules.synthetic.selection import max_spanning_tree, pair_scores
from safeaccess.rules.synthetic.summary import AttackSummary, attack_summary
from safeaccess.rules.synthetic.synthpop import (
    ReproducedUniques,
    SynthpopMeasures,
    UniquesExcess,
    reproduced_uniques,
    synthpop_measures,
    uniques_excess,
)
from safeaccess.rules.synthetic.utility import statistical_error, tvd

__all__ = [
    "AttackRow",
    "AttackSummary",
    "CheckFacts",
    "Coverage",
    "DcrReport",
    "Interval",
    "PPrivacy",
    "ReproducedUniques",
    "RuleOutcome",
    "SampledCoverage",
    "SynthRules",
    "SynthVerdict",
    "SyntheticCheckError",
    "SynthpopMeasures",
    "UniquesExcess",
    "attack_check",
    "attack_summary",
    "dcr",
    "dcr_loo",
    "dcr_report",
    "decide",
    "dependency_cliques",
    "distance_features",
    "gcap",
    "gcap_loo",
    "key_sets",
    "max_spanning_tree",
    "mst_sigmas",
    "noisy_total",
    "p_privacy",
    "pair_scores",
    "paired_bootstrap",
    "predict",
    "reproduced_uniques",
    "run_checks",
    "statistical_error",
    "synthpop_measures",
    "tvd",
    "uniques_excess",
    "verdict",
    "workload_mu",
    "yp_coverage",
    "yp_coverage_sampled",
]
