"""Model training (`model_training`) with scikit-learn -> ModelOutput.

Steps, in this order (a test that holds the data can redo them):

1. The `where` filter (the runner did it); then the records with a value in the target, every
   feature and the protected attribute, and whose target is one of its declared levels, in
   stored order (listwise deletion).
2. The split: `sklearn.model_selection.train_test_split(positions, test_size=test_fraction,
   random_state=seed, stratify=y)` over `positions = 0 .. n-1` of those records, `y` the class
   index of the target (its position among the declared levels).
3. The features: a numeric feature is one column (its value); a categorical one is one 0/1 column
   per declared level (never levels seen in the data), all zeros for an undeclared value.
4. The fit on the training records, with the fairness treatment: reweighing (sample weights
   P(a) P(y) / P(a, y) from the training records, Kamiran & Calders 2012), fairlearn's
   `ExponentiatedGradient` or its `ThresholdOptimizer`.
5. Test metrics, the fairness facts, membership-inference attacks (`model_attacks`) and the
   export (`model_export`): a JSON description, never a pickle.

Random forests are trained without bootstrap samples, so that each tree's leaves partition the
training records and a leaf's count is a count of distinct records (a bootstrap leaf of 10
samples may hold 3 people). Every tree's leaves are query sets for the auditor.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from safeaccess.client.analyses import ModelTraining
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.model_validation import feature_kind
from safeaccess.rules.outputs import (
    EncodedFeature,
    FairnessFacts,
    Label,
    ModelFacts,
    ModelOutput,
    QuerySet,
)
from safeaccess.sandbox.runner.compute import missing
from safeaccess.sandbox.runner.compute._common import AnalysisError, numeric_values, to_label

# Records outside the training/test split, in the query-set arrays.
OUTSIDE = -1


# ------------------------------------------------------------------------------ encoding


def _declared(metadata: DatasetMetadata, name: str) -> list[Label]:
    col = metadata.column(name)
    if col is None or not col.levels:
        raise AnalysisError("bad_analysis", f"{name!r} needs declared levels in the metadata")
    return list(col.levels)


def level_codes(column: pd.Series, levels: list[Label]) -> np.ndarray:
    """Index of each value among `levels` (compared as labels, or as text), -1 otherwise."""
    index: dict[Any, int] = {}
    for i, level in enumerate(levels):
        index.setdefault(level, i)
        index.setdefault(str(level), i)
    out = np.full(len(column), -1, dtype=np.int64)
    values = column.astype(object).to_numpy()
    for j, value in enumerate(values):
        if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
            continue
        label = to_label(value)
        code = index.get(label)
        if code is None:
            code = index.get(str(label))
        if code is not None:
            out[j] = code
    return out


def encode_features(
    frame: pd.DataFrame, analysis: ModelTraining, metadata: DatasetMetadata
) -> tuple[np.ndarray, list[EncodedFeature], np.ndarray]:
    """(X, encoding, complete): the encoded matrix, how each feature was encoded, and which rows
    have every feature (a missing numeric value or a missing categorical one)."""
    blocks: list[np.ndarray] = []
    encoding: list[EncodedFeature] = []
    complete = np.ones(len(frame), dtype=bool)
    for name in analysis.features:
        col = metadata.column(name)
        kind = feature_kind(col) if col is not None else None
        if kind is None:
            raise AnalysisError("bad_analysis", f"feature {name!r} cannot enter a model")
        if kind == "numeric":
            values = numeric_values(frame, name)
            complete &= ~np.isnan(values)
            blocks.append(np.nan_to_num(values)[:, None])
            encoding.append(EncodedFeature(name=name, kind="numeric", columns=[name]))
            continue
        levels = _declared(metadata, name)
        codes = level_codes(frame[name], levels)
        complete &= frame[name].notna().to_numpy()
        onehot = np.zeros((len(frame), len(levels)))
        inside = codes >= 0
        onehot[np.nonzero(inside)[0], codes[inside]] = 1.0
        blocks.append(onehot)
        encoding.append(
            EncodedFeature(
                name=name,
                kind="categorical",
                levels=levels,
                columns=[f"{name}={level}" for level in levels],
            )
        )
    x = np.hstack(blocks) if blocks else np.zeros((len(frame), 0))
    return x, encoding, complete


# ------------------------------------------------------------------------------- fitting


def reweighing(protected: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kamiran & Calders' pre-processing weights: w(a, c) = P(a) P(c) / P(a, c), so that the
    protected attribute and the class are independent in the weighted training data."""
    n = len(y)
    weights = np.ones(n)
    for a in np.unique(protected):
        in_a = protected == a
        for c in np.unique(y):
            cell = in_a & (y == c)
            joint = cell.sum()
            if joint:
                weights[cell] = (in_a.sum() / n) * ((y == c).sum() / n) / (joint / n)
    return weights


def make_estimator(analysis: ModelTraining) -> Any:
    """The scikit-learn estimator for the analysis' family and hyper-parameters."""
    p = analysis.params
    seed = analysis.seed
    leaf = p.min_samples_leaf or 1
    if analysis.family == "decision_tree":
        from sklearn.tree import DecisionTreeClassifier

        return DecisionTreeClassifier(
            max_depth=p.max_depth,
            max_leaf_nodes=p.max_leaf_nodes,
            min_samples_leaf=leaf,
            random_state=seed,
        )
    if analysis.family == "random_forest":
        from sklearn.ensemble import RandomForestClassifier

        return RandomForestClassifier(
            n_estimators=p.n_estimators or 100,
            max_depth=p.max_depth,
            max_leaf_nodes=p.max_leaf_nodes,
            min_samples_leaf=leaf,
            bootstrap=False,
            max_features="sqrt",
            random_state=seed,
            n_jobs=1,
        )
    if analysis.family == "gradient_boosting":
        from sklearn.ensemble import GradientBoostingClassifier

        return GradientBoostingClassifier(
            n_estimators=p.n_estimators or 100,
            learning_rate=p.learning_rate or 0.1,
            max_depth=p.max_depth or 3,
            max_leaf_nodes=p.max_leaf_nodes,
            min_samples_leaf=leaf,
            random_state=seed,
        )
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=p.C or 1.0, max_iter=2000)


class _Standardised:
    """Logistic regression on standardised columns (so that lbfgs converges on raw incomes and
    the penalty treats every column alike), exported on the raw scale."""

    def __init__(self, estimator: Any, mean: np.ndarray, scale: np.ndarray):
        self.estimator = estimator
        self.mean = mean
        self.scale = scale

    def raw_coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        coef = np.asarray(self.estimator.coef_, dtype=float) / self.scale
        intercept = np.asarray(self.estimator.intercept_, dtype=float) - coef @ self.mean
        return coef, intercept


def fit(
    analysis: ModelTraining,
    x: np.ndarray,
    y: np.ndarray,
    protected: np.ndarray | None,
) -> tuple[Any, _Standardised | None, Any]:
    """(estimator, scaling for logistic regression, fairness wrapper or None), fitted."""
    from sklearn.exceptions import ConvergenceWarning

    treatment = analysis.fairness.treatment if analysis.fairness is not None else "none"
    estimator = make_estimator(analysis)
    scaling: _Standardised | None = None
    fit_x = x
    if analysis.family == "logistic_regression":
        mean = x.mean(axis=0) if len(x) else np.zeros(x.shape[1])
        scale = x.std(axis=0) if len(x) else np.ones(x.shape[1])
        scale = np.where(scale > 0, scale, 1.0)
        scaling = _Standardised(estimator, mean, scale)
        fit_x = (x - mean) / scale
    weights = (
        reweighing(protected, y) if treatment == "reweighing" and protected is not None else None
    )
    wrapper: Any = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if treatment == "exponentiated_gradient" and protected is not None:
            from fairlearn.reductions import DemographicParity, EqualizedOdds, ExponentiatedGradient

            constraint = (
                EqualizedOdds()
                if analysis.fairness is not None
                and analysis.fairness.constraint == "equalized_odds"
                else DemographicParity()
            )
            wrapper = ExponentiatedGradient(estimator, constraints=constraint, max_iter=50)
            wrapper.fit(fit_x, y, sensitive_features=protected)
        elif treatment == "threshold_optimizer" and protected is not None:
            from fairlearn.postprocessing import ThresholdOptimizer

            estimator.fit(fit_x, y)
            constraints = (
                "equalized_odds"
                if analysis.fairness is not None
                and analysis.fairness.constraint == "equalized_odds"
                else "demographic_parity"
            )
            wrapper = ThresholdOptimizer(
                estimator=estimator,
                constraints=constraints,
                predict_method="predict_proba",
                prefit=True,
            )
            wrapper.fit(fit_x, y, sensitive_features=protected)
        elif weights is not None:
            estimator.fit(fit_x, y, sample_weight=weights)
        else:
            estimator.fit(fit_x, y)
    if any(issubclass(w.category, ConvergenceWarning) for w in caught):
        raise AnalysisError(
            "no_convergence",
            "the model did not converge; use a smaller C, fewer features or coarser categories",
        )
    return estimator, scaling, wrapper


def predict_proba(
    analysis: ModelTraining,
    estimator: Any,
    scaling: _Standardised | None,
    wrapper: Any,
    x: np.ndarray,
    protected: np.ndarray | None,
    n_classes: int,
    fitted_classes: np.ndarray,
) -> np.ndarray:
    """Probabilities over every declared class (0 for a class absent from training) of the
    model as released (with its fairness treatment)."""
    fit_x = (x - scaling.mean) / scaling.scale if scaling is not None else x
    treatment = analysis.fairness.treatment if analysis.fairness is not None else "none"
    if wrapper is not None and treatment == "exponentiated_gradient":
        raw = wrapper._pmf_predict(fit_x)
    elif wrapper is not None and treatment == "threshold_optimizer":
        raw = wrapper._pmf_predict(fit_x, sensitive_features=protected)
    else:
        raw = estimator.predict_proba(fit_x)
    out = np.zeros((len(x), n_classes))
    out[:, np.asarray(fitted_classes, dtype=np.int64)] = raw
    return out


# ---------------------------------------------------------------------------------- main


def split_positions(
    y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Training and test positions among the complete records (see the module docstring)."""
    from sklearn.model_selection import train_test_split

    positions = np.arange(len(y))
    try:
        train, test = train_test_split(
            positions, test_size=test_fraction, random_state=seed, stratify=y
        )
    except ValueError as exc:
        raise AnalysisError(
            "too_few_rows",
            "too few records in some class of the target for a stratified train/test split",
        ) from exc
    return np.asarray(train, dtype=np.int64), np.asarray(test, dtype=np.int64)


def model_training(
    analysis: ModelTraining, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> ModelOutput:
    from safeaccess.sandbox.runner.compute import model_attacks, model_export

    classes = _declared(metadata, analysis.target)
    x_all, encoding, complete = encode_features(frame, analysis, metadata)
    y_all = level_codes(frame[analysis.target], classes)
    complete &= y_all >= 0
    protected_levels: list[Label] = []
    protected_all: np.ndarray | None = None
    if analysis.fairness is not None:
        protected_levels = _declared(metadata, analysis.fairness.protected)
        protected_all = level_codes(frame[analysis.fairness.protected], protected_levels)
        complete &= protected_all >= 0
    rows = np.nonzero(complete)[0]
    # Listwise deletion: the records without the target, a feature or the protected attribute.
    used_columns = [analysis.target, *analysis.features]
    if analysis.fairness is not None:
        used_columns.append(analysis.fairness.protected)
    left_out = missing.listwise(used_columns, complete, frame, n_records)
    x, y = x_all[rows], y_all[rows]
    protected = protected_all[rows] if protected_all is not None else None
    if len(np.unique(y)) < 2:
        raise AnalysisError("too_few_rows", "the records used hold fewer than two target classes")
    train, test = split_positions(y, analysis.test_fraction, analysis.seed)
    p_train = protected[train] if protected is not None else None
    p_test = protected[test] if protected is not None else None
    estimator, scaling, wrapper = fit(analysis, x[train], y[train], p_train)
    fitted_classes = np.unique(y[train]).astype(np.int64)
    n_classes = len(classes)
    proba_train = predict_proba(
        analysis, estimator, scaling, wrapper, x[train], p_train, n_classes, fitted_classes
    )
    proba_test = predict_proba(
        analysis, estimator, scaling, wrapper, x[test], p_test, n_classes, fitted_classes
    )
    metrics = model_attacks.test_metrics(y[test], proba_test, n_classes)
    roc = None
    if analysis.roc and n_classes == 2:
        from safeaccess.sandbox.runner.compute.roc import coarse_roc

        roc = coarse_roc(y[test], proba_test[:, 1])
    membership = model_attacks.membership(y[train], proba_train, y[test], proba_test, analysis.seed)
    leaves = model_export.leaf_assignments(model_export.trees_of(estimator, wrapper), x[train])
    leaf_facts = model_export.leaf_counts(leaves, y[train], n_classes)
    spec, fairness_predictor, structure = model_export.export(
        analysis,
        estimator,
        scaling,
        wrapper,
        encoding,
        fitted_classes,
        n_classes,
        [str(level) for level in protected_levels],
        leaf_tables=[np.asarray(f.counts, dtype=np.int64) for f in leaf_facts],
    )
    n_params = None
    df_resid = None
    leverage = None
    if analysis.family == "logistic_regression":
        from safeaccess.sandbox.runner.compute.leverage import hat_values, leverage_facts

        # The hat matrix depends on the column space only: drop each categorical feature's
        # first level, which the intercept makes redundant (a rank-deficient QR is meaningless).
        keep: list[int] = []
        column = 0
        for feature in encoding:
            width = len(feature.columns)
            start = 1 if feature.kind == "categorical" else 0
            keep.extend(range(column + start, column + width))
            column += width
        design = np.hstack([np.ones((len(train), 1)), x[train][:, keep]])
        n_params = int(np.asarray(spec.coefficients).size + len(spec.intercept))
        df_resid = float(len(train) - n_params)
        if n_classes == 2 and (
            analysis.fairness is None or analysis.fairness.treatment != "exponentiated_gradient"
        ):
            # at the fitted weights of the (base) logistic regression
            base = predict_proba(
                analysis, estimator, scaling, None, x[train], None, n_classes, fitted_classes
            )
            p1 = base[:, 1]
            try:
                leverage = leverage_facts(hat_values(design, p1 * (1.0 - p1)))
            except np.linalg.LinAlgError:
                leverage = None
    fairness_facts = None
    fairness_report = None
    if analysis.fairness is not None and p_test is not None and p_train is not None:
        fairness_facts, fairness_report = model_attacks.fairness(
            analysis.fairness, y[test], proba_test, p_test, p_train, protected_levels
        )
    # Query sets over every stored record: array 0 = tree 0's leaves (one cell for logistic
    # regression) for training records, then one cell for the test records behind the metrics.
    stored = frame.index.to_numpy(dtype=np.int64)
    train_rows = stored[rows[train]]
    test_rows = stored[rows[test]]
    sets: list[QuerySet] = []
    tree_leaves = leaves if leaves else [np.zeros(len(train), dtype=np.int64)]
    for t, assignment in enumerate(tree_leaves):
        n_cells = int(assignment.max()) + 1 if len(assignment) else 0
        index = np.full(n_records, OUTSIDE, dtype=np.int64)
        index[train_rows] = assignment
        labels = [f"tree {t} leaf {i}" for i in range(n_cells)]
        if t == 0 and protected is not None:
            # The fairness report's per-group rates are released: one cell per protected group.
            index[test_rows] = n_cells + protected[test]
            labels += [f"test split, group {level}" for level in protected_levels]
        elif t == 0:
            index[test_rows] = n_cells
            labels.append("test split")
        sets.append(QuerySet.from_array(labels, index))
    if roc is not None:
        # The released ROC steps: per step, its test records of each class.
        index = np.full(n_records, OUTSIDE, dtype=np.int64)
        index[test_rows] = 2 * roc.band + y[test]
        labels = [
            f"ROC step {j}, {what}"
            for j in range(len(roc.steps))
            for what in ("negatives", "positives")
        ]
        sets.append(QuerySet.from_array(labels, index))
    facts = ModelFacts(
        family=analysis.family,
        n_train=len(train),
        n_test=len(test),
        leaves=leaf_facts,
        class_counts_train=np.bincount(y[train], minlength=n_classes).tolist(),
        class_counts_test=np.bincount(y[test], minlength=n_classes).tolist(),
        depth=structure.depth,
        n_leaves=structure.n_leaves,
        features_used=structure.features_used,
        n_parameters=n_params,
        df_resid=df_resid,
        leverage=leverage,
        membership=membership,
        fairness=fairness_facts,
        roc_steps=None if roc is None else roc.steps,
        query_set=sets[0],
        extra_query_sets=sets[1:],
        missing_query_sets=left_out[1],
    )
    return ModelOutput(
        family=analysis.family,
        target=analysis.target,
        classes=classes,
        features=encoding,
        model=spec,
        fairness_predictor=fairness_predictor,
        metrics=metrics,
        n_train=len(train),
        n_test=len(test),
        split={
            "method": "sklearn.model_selection.train_test_split(stratify=target)",
            "test_fraction": analysis.test_fraction,
            "seed": analysis.seed,
        },
        fairness=fairness_report,
        roc=None if roc is None else roc.points,
        missing=left_out[0],
        facts=facts,
    )


def complete_rows(
    frame: pd.DataFrame, analysis: ModelTraining, metadata: DatasetMetadata
) -> np.ndarray:
    """Positions (in `frame`) of the records a model is trained and tested on."""
    _, _, complete = encode_features(frame, analysis, metadata)
    complete &= level_codes(frame[analysis.target], _declared(metadata, analysis.target)) >= 0
    if analysis.fairness is not None:
        levels = _declared(metadata, analysis.fairness.protected)
        complete &= level_codes(frame[analysis.fairness.protected], levels) >= 0
    return np.nonzero(complete)[0]


__all__ = ["FairnessFacts", "model_training", "split_positions"]
