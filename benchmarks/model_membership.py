"""Membership-inference AUCs of trained models, released vs withheld, and the verdicts.

Runs the `model_training` runner in-process (no sandbox: this measures the attacks, not the
isolation) on the generated credit dataset (`safeaccess.server.demo.applicants`), then the
release checks of the default rule set, and prints for each model: the loss attack's AUC (with
its one-sided p-value), SACRO-ML's worst-case attack AUC (mean and largest over its repetitions),
training vs test accuracy, and the verdict with the checks that withheld it.

    python benchmarks/model_membership.py [--rows 3000] [--seed 11]
"""

from __future__ import annotations

import argparse
import time

from safeaccess.client.analyses import Fairness, ModelParams, ModelTraining
from safeaccess.rules.checks.models import release_view
from safeaccess.rules.engine import check
from safeaccess.rules.ruleset import DEFAULT_RULESET
from safeaccess.sandbox.runner import execute
from safeaccess.server.demo.applicants import applicants_metadata, generate_applicants

FEATURES = ["age", "income", "region", "group"]


def models() -> list[tuple[str, ModelTraining]]:
    def m(family: str, **params: object) -> ModelTraining:
        return ModelTraining(
            family=family,  # type: ignore[arg-type]
            target="approved",
            features=FEATURES,
            params=ModelParams(**params),  # type: ignore[arg-type]
        )

    shallow = m("decision_tree", max_depth=3, min_samples_leaf=50)
    return [
        (
            "tree depth 3, leaf >= 50, reweighing",
            shallow.model_copy(
                update={"fairness": Fairness(protected="group", treatment="reweighing")}
            ),
        ),
        ("tree depth 3, leaf >= 50", shallow),
        ("tree depth 8, leaf >= 10", m("decision_tree", max_depth=8, min_samples_leaf=10)),
        ("tree unlimited (overfit)", m("decision_tree")),
        (
            "forest 20 trees depth 4, leaf >= 50",
            m("random_forest", n_estimators=20, max_depth=4, min_samples_leaf=50),
        ),
        ("forest 100 trees unlimited", m("random_forest", n_estimators=100)),
        (
            "boosting 50 x depth 2, leaf >= 50",
            m("gradient_boosting", n_estimators=50, max_depth=2, min_samples_leaf=50),
        ),
        ("boosting 300 x depth 6", m("gradient_boosting", n_estimators=300, max_depth=6)),
        ("logistic regression C=1", m("logistic_regression")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    frame = generate_applicants(args.rows, seed=args.seed)
    meta = applicants_metadata()
    rs = DEFAULT_RULESET
    print(
        f"generated applicants: {args.rows} records, seed {args.seed}; "
        f"limit model_mia_auc_limit={rs.model_mia_auc_limit}, threshold={rs.threshold}"
    )
    header = f"{'model':40} {'loss AUC':>8} {'p':>8} {'WC mean':>8} {'WC max':>8} {'train':>6} {'test':>6} {'s':>5}  verdict"
    print(header)
    print("-" * len(header))
    for name, analysis in models():
        start = time.perf_counter()
        out = release_view(execute(analysis, frame, meta), rs)
        seconds = time.perf_counter() - start
        decision = check(out, rs)
        m = out.facts.membership
        assert m is not None
        why = sorted({f.check for f in decision.findings if f.verdict == "withhold"})
        p = f"{m.loss_auc_p_value:.1e}" if m.loss_auc_p_value is not None else "-"
        print(
            f"{name:40} {m.loss_auc:8.3f} {p:>8} {m.worst_case_auc:8.3f} "
            f"{(m.worst_case_auc_max or 0):8.3f} {m.train_accuracy or 0:6.3f} "
            f"{m.test_accuracy or 0:6.3f} {seconds:5.1f}  {decision.verdict}"
            + (f" ({', '.join(why)})" if why else "")
        )


if __name__ == "__main__":
    main()
