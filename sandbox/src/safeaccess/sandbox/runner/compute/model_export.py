"""A fitted scikit-learn model as a JSON description (`ModelSpec`), never a pickle.

Trees are exported as parallel node arrays. Only leaves carry values (internal nodes hold empty
lists): an internal node's value is an aggregate of its subtree's leaves and adds nothing a
predictor needs. Thresholds are scikit-learn's: it compares the feature converted to float32
with the float64 threshold (`x <= t` goes left), and the client's predictor does the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from safeaccess.client.analyses import ModelTraining
from safeaccess.rules.outputs import (
    EncodedFeature,
    FairnessPredictor,
    ModelSpec,
    ModelTree,
    ThresholdRule,
    TreeLeafFacts,
)


@dataclass(frozen=True)
class Structure:
    depth: int | None
    n_leaves: int | None
    features_used: list[str]


def trees_of(estimator: Any, wrapper: Any) -> list[Any]:
    """The fitted scikit-learn trees of the released model, in export order."""
    models = _released_estimators(estimator, wrapper)
    out: list[Any] = []
    for model in models:
        if hasattr(model, "tree_"):
            out.append(model)
        elif hasattr(model, "estimators_"):
            members = model.estimators_
            if isinstance(members, np.ndarray):
                out.extend(members.ravel().tolist())  # boosting: stage by stage
            else:
                out.extend(members)
    return out


def _released_estimators(estimator: Any, wrapper: Any) -> list[Any]:
    if wrapper is not None and hasattr(wrapper, "predictors_"):
        weights = np.asarray(wrapper.weights_, dtype=float)
        return [p for p, w in zip(wrapper.predictors_, weights, strict=True) if w > 0]
    return [estimator]


def leaf_assignments(trees: list[Any], x: np.ndarray) -> list[np.ndarray]:
    """Per tree, the leaf (0, 1, ... in node order) each training record reaches."""
    out: list[np.ndarray] = []
    for tree in trees:
        nodes = np.asarray(tree.apply(np.asarray(x, dtype=np.float32)), dtype=np.int64)
        is_leaf = tree.tree_.children_left == -1
        leaf_number = np.cumsum(is_leaf) - 1
        out.append(leaf_number[nodes])
    return out


def leaf_counts(leaves: list[np.ndarray], y: np.ndarray, n_classes: int) -> list[TreeLeafFacts]:
    """Training records per leaf and class, for every tree."""
    facts: list[TreeLeafFacts] = []
    for assignment in leaves:
        n_leaves = int(assignment.max()) + 1 if len(assignment) else 0
        table = np.zeros((n_leaves, n_classes), dtype=np.int64)
        np.add.at(table, (assignment, y), 1)
        facts.append(TreeLeafFacts(counts=table.tolist()))
    return facts


def _tree(
    tree: Any, fitted: np.ndarray, n_classes: int, classifier: bool, x_counts: np.ndarray | None
) -> ModelTree:
    t = tree.tree_
    left = t.children_left.tolist()
    right = t.children_right.tolist()
    is_leaf = t.children_left == -1
    values: list[list[float]] = []
    counts: list[list[int] | None] = []
    leaf_number = 0
    for i in range(t.node_count):
        if not is_leaf[i]:
            values.append([])
            counts.append(None)
            continue
        v = np.asarray(t.value[i][0], dtype=float)
        if classifier:
            probs = np.zeros(n_classes)
            total = v.sum()
            probs[fitted[: len(v)]] = v / total if total > 0 else 0.0
            values.append(probs.tolist())
            counts.append(x_counts[leaf_number].tolist() if x_counts is not None else None)
        else:
            values.append(v.tolist())
            counts.append(None)
        leaf_number += 1
    return ModelTree(
        feature=[int(f) if not leaf else -1 for f, leaf in zip(t.feature, is_leaf, strict=True)],
        threshold=[
            float(h) if not leaf else 0.0 for h, leaf in zip(t.threshold, is_leaf, strict=True)
        ],
        left=left,
        right=right,
        value=values,
        counts=counts if classifier else None,
    )


def _spec(
    family: str,
    model: Any,
    scaling: Any,
    fitted: np.ndarray,
    n_classes: int,
    leaf_tables: list[np.ndarray] | None,
) -> ModelSpec:
    fitted_list = [int(c) for c in fitted]
    if family == "logistic_regression":
        coef = np.asarray(model.coef_, dtype=float) / scaling.scale
        intercept = np.asarray(model.intercept_, dtype=float) - coef @ scaling.mean
        return ModelSpec(
            family="logistic_regression",
            coefficients=coef.tolist(),
            intercept=intercept.tolist(),
            fitted_classes=fitted_list,
        )
    if family == "gradient_boosting":
        stages = model.estimators_
        trees = [
            _tree(tree, fitted, n_classes, classifier=False, x_counts=None)
            for tree in stages.ravel().tolist()
        ]
        init = np.asarray(model._raw_predict_init(np.zeros((1, model.n_features_in_))), dtype=float)
        return ModelSpec(
            family="gradient_boosting",
            trees=trees,
            per_stage=int(stages.shape[1]),
            init=init[0].tolist(),
            learning_rate=float(model.learning_rate),
            fitted_classes=fitted_list,
        )
    members = [model] if family == "decision_tree" else list(model.estimators_)
    trees = [
        _tree(
            tree,
            fitted,
            n_classes,
            classifier=True,
            x_counts=None if leaf_tables is None else leaf_tables[i],
        )
        for i, tree in enumerate(members)
    ]
    return ModelSpec(family=family, trees=trees, fitted_classes=fitted_list)


def _threshold_rules(wrapper: Any, protected_levels: list[str]) -> dict[str, ThresholdRule]:
    rules: dict[str, ThresholdRule] = {}
    table = wrapper.interpolated_thresholder_.interpolation_dict
    for group, entry in table.items():
        level = protected_levels[int(group)]
        op0, op1 = entry["operation0"], entry["operation1"]
        rules[level] = ThresholdRule(
            p0=float(entry["p0"]),
            operator0=op0.operator,
            threshold0=_finite(op0.threshold),
            p1=float(entry["p1"]),
            operator1=op1.operator,
            threshold1=_finite(op1.threshold),
        )
    return rules


def _finite(value: float) -> float:
    # fairlearn uses +-inf for "always" / "never"; JSON has no infinity, and probabilities lie
    # in [0, 1], so +-2 decides the same way.
    v = float(value)
    return max(-2.0, min(2.0, v))


def export(
    analysis: ModelTraining,
    estimator: Any,
    scaling: Any,
    wrapper: Any,
    encoding: list[EncodedFeature],
    fitted: np.ndarray,
    n_classes: int,
    protected_levels: list[str],
    leaf_tables: list[np.ndarray] | None = None,
) -> tuple[ModelSpec, FairnessPredictor | None, Structure]:
    """The released description of the fitted model and its fairness treatment."""
    family = analysis.family
    treatment = analysis.fairness.treatment if analysis.fairness is not None else "none"
    predictor: FairnessPredictor | None = None
    if wrapper is not None and treatment == "exponentiated_gradient":
        assert analysis.fairness is not None
        weights = np.asarray(wrapper.weights_, dtype=float)
        members = [p for p, w in zip(wrapper.predictors_, weights, strict=True) if w > 0]
        kept = [float(w) for w in weights if w > 0]
        ensemble = [_spec(family, m, scaling, fitted, n_classes, None) for m in members]
        predictor = FairnessPredictor(
            treatment="exponentiated_gradient",
            protected=analysis.fairness.protected,
            weights=kept,
            ensemble=ensemble,
        )
        spec = ModelSpec(family=family, fitted_classes=[int(c) for c in fitted])
        models = members
    else:
        spec = _spec(family, estimator, scaling, fitted, n_classes, leaf_tables)
        models = [estimator]
        if wrapper is not None and treatment == "threshold_optimizer":
            assert analysis.fairness is not None
            predictor = FairnessPredictor(
                treatment="threshold_optimizer",
                protected=analysis.fairness.protected,
                rules=_threshold_rules(wrapper, protected_levels),
            )
    column_feature: list[str] = []
    for feature in encoding:
        column_feature.extend([feature.name] * len(feature.columns))
    used: set[int] = set()
    depth: int | None = None
    n_leaves: int | None = None
    if family == "logistic_regression":
        for model in models:
            coef = np.asarray(model.coef_)
            used.update(int(j) for j in np.nonzero(np.any(coef != 0, axis=0))[0])
    else:
        trees = trees_of(estimator, wrapper)
        for tree in trees:
            t = tree.tree_
            used.update(
                int(f) for f, left in zip(t.feature, t.children_left, strict=True) if left != -1
            )
        depth = max((int(tree.tree_.max_depth) for tree in trees), default=0)
        n_leaves = max((int(tree.tree_.n_leaves) for tree in trees), default=0)
    features_used = sorted({column_feature[j] for j in used if j < len(column_feature)})
    return spec, predictor, Structure(depth=depth, n_leaves=n_leaves, features_used=features_used)
