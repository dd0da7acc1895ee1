"""Trained models (`model_training`): what must hold before a model leaves the centre.

Sources and anchors: the DwB/SDAP guidelines (thresholds, class disclosure, residual degrees of
freedom) as ACRO encodes them; SACRO-ML's structural attack (k-anonymity of the decision
space's partitions, class disclosure where a partition gives some class probability zero,
residual degrees of freedom) and its worst-case membership-inference attack; the loss attack of
Yeom et al. (2018). The checks:

- `model_family`: a family that stores training records (k-NN, SVM support vectors) is never
  released; the analysis language cannot ask for one, and an output claiming one is refused.
- `leaf_threshold`: every leaf of every tree rests on at least `threshold` training records (a
  leaf is a table cell: its class counts or score describe the records in it).
- `leaf_class_disclosure`: no leaf holds more than `class_disclosure` of its records in one class
  (the frequency-table rule), and with `zeros_disclosive` no leaf lacks a class that training
  holds (SACRO-ML's class disclosure: the leaf tells that none of its records has that class).
- `dof` and `leverage`: logistic regression coefficients need residual degrees of freedom and no
  record fitted (almost) exactly, as regressions do.
- `membership_inference`: both attacks' AUC at most `model_mia_auc_limit`.
- `fairness`: demographic parity and equalised odds differences against `model_fairness_limit`.
- `explainability`: the fitted model's actual depth, leaves, trees and features used against the
  rule set's limits.
- `model_split`: the training and test records each reach the threshold (the test metrics are
  aggregates over the test records).
- `class_threshold`: every declared class has at least `threshold` training and test records
  (with `zeros_disclosive`, none may be empty).

`param_problems` decides from the analysis alone, before anything runs, whether its declared
hyper-parameters are within the rule set's limits. `release_view` narrows the fairness report to
groups with at least `threshold` test records before the output is checked and released.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from safeaccess.rules.checks.leverage import leverage_findings
from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import FairnessGroup, ModelOutput
from safeaccess.rules.ruleset import RuleSet

#: Families whose fitted form stores training records: never released.
RECORD_EMBEDDING = frozenset({"knn", "k_nearest_neighbours", "svm", "svc", "support_vector"})
#: Families the checks know how to judge.
KNOWN_FAMILIES = frozenset(
    {"decision_tree", "random_forest", "gradient_boosting", "logistic_regression"}
)
TREE_FAMILIES = frozenset({"decision_tree", "random_forest", "gradient_boosting"})

# How many individual leaves a finding names before it summarises the rest.
_NAMED = 5


def param_problems(
    family: str, params: Mapping[str, Any], n_features: int, rs: RuleSet
) -> list[str]:
    """Why the declared hyper-parameters break the centre's limits (empty when they do not)."""
    out: list[str] = []
    trees = family in TREE_FAMILIES
    for key, limit, what in (
        ("max_depth", rs.model_max_depth, "tree depth"),
        ("max_leaf_nodes", rs.model_max_leaves, "leaves per tree"),
    ):
        if not trees or limit is None:
            continue
        value = params.get(key)
        if value is None:
            out.append(f"params.{key}: this centre releases {what} up to {limit}; set {key}")
        elif int(value) > limit:
            out.append(f"params.{key}: {value} exceeds this centre's limit of {limit} {what}")
    if family in ("random_forest", "gradient_boosting") and rs.model_max_estimators is not None:
        value = params.get("n_estimators") or 100
        if int(value) > rs.model_max_estimators:
            out.append(
                f"params.n_estimators: {value} trees exceed this centre's limit of "
                f"{rs.model_max_estimators} (100 when not set)"
            )
    if rs.model_max_features is not None and n_features > rs.model_max_features:
        out.append(
            f"features: {n_features} features exceed this centre's limit of {rs.model_max_features}"
        )
    return out


def _rates(stats: Mapping[str, int]) -> tuple[float | None, float | None, float | None]:
    n = stats.get("n", 0)
    pos = stats.get("positives", 0)
    neg = n - pos
    selection = stats.get("predicted_positive", 0) / n if n else None
    tpr = stats.get("true_positive", 0) / pos if pos else None
    fpr = stats.get("false_positive", 0) / neg if neg else None
    return selection, tpr, fpr


def _spread(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) - min(present) if len(present) >= 2 else None


def release_view(output: ModelOutput, rs: RuleSet) -> ModelOutput:
    """The output as it may leave: the fairness report over the protected groups that have at
    least `threshold` test records (their selection rates, and the differences between them);
    smaller groups get no rate and are left out of the differences."""
    report = output.fairness
    facts = output.facts.fairness
    if report is None or facts is None:
        return output
    groups: list[FairnessGroup] = []
    selections: list[float | None] = []
    tprs: list[float | None] = []
    fprs: list[float | None] = []
    left_out = 0
    for group in report.groups:
        stats = facts.group_confusion.get(str(group.level), {})
        if stats.get("n", 0) < rs.threshold:
            left_out += 1
            groups.append(FairnessGroup(level=group.level, selection_rate=None))
            continue
        selection, tpr, fpr = _rates(stats)
        selections.append(selection)
        tprs.append(tpr)
        fprs.append(fpr)
        groups.append(FairnessGroup(level=group.level, selection_rate=selection))
    dp = _spread(selections)
    tpr_gap, fpr_gap = _spread(tprs), _spread(fprs)
    gaps = [g for g in (tpr_gap, fpr_gap) if g is not None]
    narrowed = report.model_copy(
        update={
            "groups": groups,
            "demographic_parity_difference": dp,
            "equalized_odds_difference": max(gaps) if gaps else None,
            "groups_left_out": left_out,
        }
    )
    return output.model_copy(update={"fairness": narrowed})


def _family(output: ModelOutput) -> list[Finding]:
    family = str(output.facts.family or output.family)
    if output.facts.embeds_records or family in RECORD_EMBEDDING or family not in KNOWN_FAMILIES:
        return [
            Finding(
                check="model_family",
                verdict="withhold",
                item=family,
                message=f"a {family} model stores training records (or is not a family this "
                "centre checks), so it is never released.",
            )
        ]
    return []


def _leaves(output: ModelOutput, rs: RuleSet) -> list[Finding]:
    out: list[Finding] = []
    small: list[tuple[int, int, int]] = []  # (tree, leaf, records)
    dominated: list[tuple[int, int, float]] = []
    zeros: list[tuple[int, int]] = []
    trained = [0] * max((len(r) for t in output.facts.leaves for r in t.counts), default=0)
    for tree in output.facts.leaves[:1]:
        for row in tree.counts:
            for k, c in enumerate(row):
                trained[k] += c
    for t, tree in enumerate(output.facts.leaves):
        for i, row in enumerate(tree.counts):
            total = sum(row)
            if total < rs.threshold:
                small.append((t, i, total))
            if total and rs.class_disclosure is not None:
                share = max(row) / total
                if share > rs.class_disclosure:
                    dominated.append((t, i, share))
            empty_class = any(c == 0 and trained[k] > 0 for k, c in enumerate(row))
            if total and rs.zeros_disclosive and empty_class:
                zeros.append((t, i))
    if small:
        named = ", ".join(f"tree {t} leaf {i} ({n})" for t, i, n in small[:_NAMED])
        more = f" and {len(small) - _NAMED} more" if len(small) > _NAMED else ""
        out.append(
            Finding(
                check="leaf_threshold",
                verdict="withhold",
                item=f"{len(small)} leaves",
                message=f"{len(small)} leaves rest on fewer than {rs.threshold} training records "
                f"(smallest {min(n for _, _, n in small)}): {named}{more}. Set min_samples_leaf "
                f"to at least {rs.threshold}, or limit max_depth / max_leaf_nodes.",
            )
        )
    if dominated:
        named = ", ".join(f"tree {t} leaf {i} ({s:.0%})" for t, i, s in dominated[:_NAMED])
        more = f" and {len(dominated) - _NAMED} more" if len(dominated) > _NAMED else ""
        out.append(
            Finding(
                check="leaf_class_disclosure",
                verdict="withhold",
                item=f"{len(dominated)} leaves",
                message=f"{len(dominated)} leaves hold more than {rs.class_disclosure:.0%} of "
                f"their records in one class: {named}{more}. Whoever falls in such a leaf has "
                "that class almost surely; use larger leaves or fewer splits.",
            )
        )
    if zeros:
        named = ", ".join(f"tree {t} leaf {i}" for t, i in zeros[:_NAMED])
        more = f" and {len(zeros) - _NAMED} more" if len(zeros) > _NAMED else ""
        out.append(
            Finding(
                check="leaf_class_disclosure",
                verdict="withhold",
                item=f"{len(zeros)} leaves",
                message=f"{len(zeros)} leaves hold no record of a class the training records "
                f"have (an empty cell): {named}{more}.",
            )
        )
    return out


def _split(output: ModelOutput, rs: RuleSet) -> list[Finding]:
    f = output.facts
    if min(f.n_train, f.n_test) >= rs.threshold:
        return []
    return [
        Finding(
            check="model_split",
            verdict="withhold",
            item="split",
            message=f"the split has {f.n_train} training and {f.n_test} test records; each "
            f"needs at least {rs.threshold}.",
        )
    ]


def _classes(output: ModelOutput, rs: RuleSet) -> list[Finding]:
    """Each class's training and test records form a one-way table (the leaf counts sum to
    the first, the test metrics' per-class recalls rest on the second): the threshold applies
    to every class, and an empty class is a zero cell."""
    out: list[Finding] = []
    f = output.facts
    for split, counts in (("training", f.class_counts_train), ("test", f.class_counts_test)):
        for k, n in enumerate(counts):
            label = output.classes[k] if k < len(output.classes) else k
            if 0 < n < rs.threshold or (n == 0 and rs.zeros_disclosive):
                out.append(
                    Finding(
                        check="class_threshold",
                        verdict="withhold",
                        item=f"{output.target}={label} ({split})",
                        message=f"{n} {split} records have {output.target}={label}; each class "
                        f"needs at least {rs.threshold}"
                        + (" (an empty class is a disclosive zero)" if n == 0 else "")
                        + ". Merge rare classes or widen the selection.",
                    )
                )
    return out


def _coefficients(output: ModelOutput, rs: RuleSet) -> list[Finding]:
    f = output.facts
    if output.family != "logistic_regression":
        return []
    out: list[Finding] = []
    if f.df_resid is not None and f.df_resid < rs.dof:
        out.append(
            Finding(
                check="dof",
                verdict="withhold",
                item="model",
                message=f"the model has {f.df_resid:g} residual degrees of freedom; at least "
                f"{rs.dof} are needed. Use more records or fewer features.",
            )
        )
    out += leverage_findings(f.leverage, rs, "model", required=False)
    return out


def _membership(output: ModelOutput, rs: RuleSet) -> list[Finding]:
    m = output.facts.membership
    limit = rs.model_mia_auc_limit
    if limit >= 1.0:
        return []
    if m is None:
        return [
            Finding(
                check="membership_inference",
                verdict="review",
                item="model",
                message="the model came without membership-inference results; a person must "
                "check it.",
            )
        ]
    worst = max(m.loss_auc, m.worst_case_auc)
    if worst <= limit:
        return []
    return [
        Finding(
            check="membership_inference",
            verdict="withhold",
            item="model",
            message=f"a membership-inference attack tells training from test records with AUC "
            f"{worst:.3f} (loss attack {m.loss_auc:.3f}, worst-case attack "
            f"{m.worst_case_auc:.3f}; limit {limit:g}; training accuracy "
            f"{m.train_accuracy if m.train_accuracy is not None else float('nan'):.3f} vs test "
            f"{m.test_accuracy if m.test_accuracy is not None else float('nan'):.3f}). The model "
            "memorises its training records: use larger leaves, shallower trees or more "
            "regularisation.",
        )
    ]


def _fairness(output: ModelOutput, rs: RuleSet) -> list[Finding]:
    report = output.fairness
    if report is None:
        return []
    values = {
        "demographic parity difference": report.demographic_parity_difference,
        "equalised odds difference": report.equalized_odds_difference,
    }
    text = ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} n/a" for k, v in values.items())
    limit = rs.model_fairness_limit
    over = [k for k, v in values.items() if limit is not None and v is not None and v > limit]
    if not over or rs.model_fairness_action == "report":
        return [
            Finding(
                check="fairness",
                verdict="release",
                item=report.protected,
                message=f"fairness on {report.protected} (test split): {text}"
                + (f"; above the policy limit {limit:g} (reported only)" if over else ""),
            )
        ]
    return [
        Finding(
            check="fairness",
            verdict=rs.model_fairness_action,
            item=report.protected,
            message=f"fairness on {report.protected} (test split): {text}; "
            f"{' and '.join(over)} above the policy limit {limit:g}.",
        )
    ]


def _explainability(output: ModelOutput, rs: RuleSet) -> list[Finding]:
    f = output.facts
    broken: list[str] = []
    if rs.model_max_depth is not None and f.depth is not None and f.depth > rs.model_max_depth:
        broken.append(f"depth {f.depth} > {rs.model_max_depth}")
    if (
        rs.model_max_leaves is not None
        and f.n_leaves is not None
        and f.n_leaves > rs.model_max_leaves
    ):
        broken.append(f"{f.n_leaves} leaves > {rs.model_max_leaves}")
    n_trees = len(f.leaves)
    if (
        rs.model_max_estimators is not None
        and output.family in ("random_forest", "gradient_boosting")
        and n_trees > rs.model_max_estimators * max(1, output.model.per_stage)
    ):
        broken.append(f"{n_trees} trees > {rs.model_max_estimators}")
    if rs.model_max_features is not None and len(f.features_used) > rs.model_max_features:
        broken.append(f"{len(f.features_used)} features used > {rs.model_max_features}")
    if not broken:
        return []
    return [
        Finding(
            check="explainability",
            verdict="withhold",
            item="model",
            message=f"the trained model exceeds this centre's limits: {'; '.join(broken)}.",
        )
    ]


def model_findings(output: ModelOutput, rs: RuleSet) -> list[Finding]:
    """Every check above, in order."""
    family = _family(output)
    if family:
        return family
    return [
        *_split(output, rs),
        *_classes(output, rs),
        *_leaves(output, rs),
        *_coefficients(output, rs),
        *_membership(output, rs),
        *_explainability(output, rs),
        *_fairness(output, rs),
        *_roc(output, rs),
    ]


def _roc(output: ModelOutput, rs: RuleSet) -> list[Finding]:
    """Each step of a released ROC curve adds at least `threshold` true and false positives:
    a smaller step tells how few test records of a class score in that band."""
    if output.roc is None:
        return []
    steps = output.facts.roc_steps
    if steps is None or len(steps) != len(output.roc) - 1:
        return [
            Finding(
                check="facts_missing",
                verdict="review",
                message="the records behind the ROC curve's steps were not recorded; an "
                "output checker must review it.",
            )
        ]
    out: list[Finding] = []
    for j, step in enumerate(steps):
        if min(step.true_positives, step.false_positives) < rs.threshold:
            out.append(
                Finding(
                    check="roc",
                    verdict="withhold",
                    item=f"ROC step {j + 1}",
                    message=f"step {j + 1} of the ROC curve adds {step.true_positives} true and "
                    f"{step.false_positives} false positives; at least {rs.threshold} of each "
                    "are needed. Train without roc=True or on more test records.",
                )
            )
    return out
