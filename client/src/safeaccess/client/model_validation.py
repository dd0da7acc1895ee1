"""What a `model_training` analysis must satisfy against the dataset metadata (no data needed).

Shared by the server's validation (`validation.validate`) and the sandbox runner, which encodes
the features the same way: a feature is numeric (one column) or categorical (one 0/1 column per
declared level). Hyper-parameters must apply to the family; the centre's own tighter limits are
checked by `safeaccess.rules.checks.models.param_problems` against the rule set.
"""

from __future__ import annotations

from typing import Literal

from safeaccess.client.analyses import ModelTraining
from safeaccess.client.metadata import HIDDEN_TYPES, Column, DatasetMetadata

FeatureKind = Literal["numeric", "categorical"]

#: Which hyper-parameters each family accepts.
FAMILY_PARAMS: dict[str, frozenset[str]] = {
    "decision_tree": frozenset({"max_depth", "max_leaf_nodes", "min_samples_leaf"}),
    "random_forest": frozenset({"max_depth", "max_leaf_nodes", "min_samples_leaf", "n_estimators"}),
    "gradient_boosting": frozenset(
        {"max_depth", "max_leaf_nodes", "min_samples_leaf", "n_estimators", "learning_rate"}
    ),
    "logistic_regression": frozenset({"C"}),
}

#: Treatments that need a two-class target (fairlearn's reductions and threshold optimiser).
BINARY_TREATMENTS = frozenset({"exponentiated_gradient", "threshold_optimizer"})


def feature_kind(col: Column) -> FeatureKind | None:
    """How a column enters a model: numeric, categorical (one-hot on declared levels), or None
    when it cannot (identifiers, categoricals without declared levels)."""
    if col.type in ("integer", "continuous"):
        return "numeric"
    if col.type == "ordinal":
        if col.scale is not None or (
            col.levels and all(isinstance(v, int) and not isinstance(v, bool) for v in col.levels)
        ):
            return "numeric"
        return "categorical" if col.levels else None
    if col.type == "categorical":
        return "categorical" if col.levels else None
    return None


def model_problems(analysis: ModelTraining, metadata: DatasetMetadata) -> list[tuple[str, str]]:
    """(field, message) for each reason the analysis cannot run on this dataset."""
    problems: list[tuple[str, str]] = []
    target = metadata.column(analysis.target)
    if target is not None and target.type not in HIDDEN_TYPES:
        if target.type not in ("categorical", "ordinal") or not target.levels:
            problems.append(
                (
                    "target",
                    f"the target {analysis.target!r} must be a categorical or ordinal "
                    "column with declared levels",
                )
            )
        elif len(target.levels) < 2:
            problems.append(("target", f"the target {analysis.target!r} declares one level"))
    for i, name in enumerate(analysis.features):
        col = metadata.column(name)
        if col is None or col.type in HIDDEN_TYPES:
            continue  # reported by the column check
        if name == analysis.target:
            problems.append((f"features[{i}]", f"{name!r} is the target; it cannot be a feature"))
        elif feature_kind(col) is None:
            problems.append(
                (
                    f"features[{i}]",
                    f"{name!r} is {col.type} without declared levels; a model "
                    "encodes categorical features on the levels the metadata declares",
                )
            )
    if len(set(analysis.features)) != len(analysis.features):
        problems.append(("features", "a feature is listed twice"))
    allowed = FAMILY_PARAMS[analysis.family]
    for key, value in analysis.params.model_dump().items():
        if value is not None and key not in allowed:
            problems.append(
                (
                    f"params.{key}",
                    f"{key} does not apply to {analysis.family}; it takes "
                    f"{', '.join(sorted(allowed))}",
                )
            )
    fairness = analysis.fairness
    if fairness is not None:
        col = metadata.column(fairness.protected)
        if col is not None and col.type not in HIDDEN_TYPES:
            if col.type not in ("categorical", "ordinal") or not col.levels:
                problems.append(
                    (
                        "fairness.protected",
                        f"{fairness.protected!r} must be a categorical column with declared levels",
                    )
                )
            if fairness.protected == analysis.target:
                problems.append(("fairness.protected", "the protected attribute is the target"))
        if target is not None and target.levels is not None and len(target.levels) != 2:
            problems.append(
                (
                    "fairness",
                    "fairness metrics need a target with exactly two declared levels "
                    "(the second is the positive class)",
                )
            )
    return problems
