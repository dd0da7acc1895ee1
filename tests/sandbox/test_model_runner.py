"""The model runner and the client's predictor, against scikit-learn models this test fits itself
on the split and encoding docs/models.md describes (scikit-learn is the oracle)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.tree import DecisionTreeClassifier

from safeaccess.client.analyses import Fairness, ModelParams, ModelTraining
from safeaccess.client.models import ModelFormatError, Predictor
from safeaccess.client.validation import AnalysisInvalid, validate
from safeaccess.rules.outputs import public
from safeaccess.sandbox.backend import RunnerResponse, decode_reply, encode_reply
from safeaccess.sandbox.runner import execute
from safeaccess.sandbox.runner.compute.models import reweighing
from safeaccess.server.demo.applicants import applicants_metadata, generate_applicants
from safeaccess.server.demo.data import census_metadata, generate_census

FEATURES = ["age", "income", "region"]


@pytest.fixture(scope="module")
def data() -> pd.DataFrame:
    return generate_applicants(1500, seed=5)


def _encode(frame: pd.DataFrame) -> np.ndarray:
    """The documented encoding: numeric as is, categoricals one-hot on the declared levels."""
    regions = ["North", "South", "East", "West"]
    cols = [frame["age"].to_numpy(float), frame["income"].to_numpy(float)]
    cols += [(frame["region"].astype(str) == r).to_numpy(float) for r in regions]
    return np.column_stack(cols)


def _split(frame: pd.DataFrame, analysis: ModelTraining) -> tuple[np.ndarray, np.ndarray]:
    y = (frame["approved"].astype(str) == "yes").to_numpy(int)
    return train_test_split(
        np.arange(len(frame)),
        test_size=analysis.test_fraction,
        random_state=analysis.seed,
        stratify=y,
    )


def _oracle(analysis: ModelTraining, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's probabilities on the test records, and the test positions."""
    train, test = _split(frame, analysis)
    x = _encode(frame)
    y = (frame["approved"].astype(str) == "yes").to_numpy(int)
    p = analysis.params
    if analysis.family == "decision_tree":
        model = DecisionTreeClassifier(
            max_depth=p.max_depth,
            min_samples_leaf=p.min_samples_leaf or 1,
            random_state=analysis.seed,
        )
    elif analysis.family == "random_forest":
        model = RandomForestClassifier(
            n_estimators=p.n_estimators or 100,
            max_depth=p.max_depth,
            min_samples_leaf=p.min_samples_leaf or 1,
            bootstrap=False,
            max_features="sqrt",
            random_state=analysis.seed,
        )
    elif analysis.family == "gradient_boosting":
        model = GradientBoostingClassifier(
            n_estimators=p.n_estimators or 100,
            learning_rate=p.learning_rate or 0.1,
            max_depth=p.max_depth or 3,
            min_samples_leaf=p.min_samples_leaf or 1,
            random_state=analysis.seed,
        )
    else:
        mean, sd = x[train].mean(axis=0), x[train].std(axis=0)
        model = LogisticRegression(C=p.C or 1.0, max_iter=2000)
        model.fit((x[train] - mean) / sd, y[train])
        return model.predict_proba((x[test] - mean) / sd), test
    model.fit(x[train], y[train])
    return model.predict_proba(x[test]), test


@pytest.mark.parametrize(
    "analysis",
    [
        ModelTraining(
            family="decision_tree",
            target="approved",
            features=FEATURES,
            params=ModelParams(max_depth=4, min_samples_leaf=20),
            seed=1,
        ),
        ModelTraining(
            family="random_forest",
            target="approved",
            features=FEATURES,
            params=ModelParams(n_estimators=7, max_depth=3, min_samples_leaf=20),
            seed=2,
        ),
        ModelTraining(
            family="gradient_boosting",
            target="approved",
            features=FEATURES,
            params=ModelParams(n_estimators=8, max_depth=2, learning_rate=0.2),
            seed=3,
        ),
        ModelTraining(
            family="logistic_regression",
            target="approved",
            features=FEATURES,
            params=ModelParams(C=0.5),
            test_fraction=0.25,
        ),
    ],
    ids=lambda a: a.family,
)
def test_the_predictor_reproduces_scikit_learn(analysis: ModelTraining, data: pd.DataFrame) -> None:
    out = execute(analysis, data, applicants_metadata())
    released = public(out)
    model = Predictor(released)
    expected, test = _oracle(analysis, data)
    got = np.asarray(model.predict_proba(data.iloc[test]))
    assert got == pytest.approx(expected, abs=1e-9)
    # and the released metrics are those of these predictions
    truth = (data["approved"].astype(str) == "yes").to_numpy(int)[test]
    assert out.metrics["accuracy"] == pytest.approx(np.mean(expected.argmax(axis=1) == truth))
    assert out.n_test == len(test)


def test_the_export_is_json_and_not_a_pickle(data: pd.DataFrame) -> None:
    analysis = ModelTraining(
        family="decision_tree",
        target="approved",
        features=FEATURES,
        params=ModelParams(max_depth=2, min_samples_leaf=30),
    )
    out = execute(analysis, data, applicants_metadata())
    text = RunnerResponse(ok=True, output=out).model_dump_json()
    assert "pickle" not in text and "sklearn" not in text.replace("sklearn.model_selection", "")
    tree = out.model.trees[0]
    # internal nodes carry no values, leaves carry probabilities and class counts
    for i, left in enumerate(tree.left):
        assert (tree.value[i] == []) == (left != -1)
    assert sum(sum(c) for c in tree.counts or [] if c is not None) == out.n_train


def test_leaf_query_sets_travel_on_the_side_channel(data: pd.DataFrame) -> None:
    analysis = ModelTraining(
        family="random_forest",
        target="approved",
        features=FEATURES,
        params=ModelParams(n_estimators=3, max_depth=2, min_samples_leaf=30),
    )
    out = execute(analysis, data, applicants_metadata())
    reply = decode_reply(encode_reply(RunnerResponse(ok=True, output=out)))
    # the main set, trees 1 and 2's leaves, then the records a missing value left out
    assert reply is not None and len(reply.arrays) == 4
    decoded = reply.response.output
    main = decoded.facts.query_set.to_array()  # type: ignore[union-attr]
    # every record is in a leaf of tree 0 (training) or in the test cell
    assert (main >= 0).all() and (
        main == len(decoded.facts.query_set.labels) - 1
    ).sum() == out.n_test  # type: ignore[union-attr]
    for extra in decoded.facts.extra_query_sets:  # type: ignore[union-attr]
        values = extra.to_array()
        assert (values >= 0).sum() == out.n_train
    (dropped,) = decoded.facts.missing_query_sets  # type: ignore[union-attr]
    incomplete = data[[*FEATURES, "approved"]].isna().any(axis=1).sum()
    assert (dropped.to_array() >= 0).sum() == incomplete


def test_reweighing_makes_the_attribute_independent_of_the_class() -> None:
    a = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    y = np.array([1, 1, 1, 0, 1, 0, 0, 0, 0, 0])
    w = reweighing(a, y)
    # weighted share of class 1 is the same in both groups (= overall 4/10)
    for g in (0, 1):
        mask = a == g
        assert w[mask & (y == 1)].sum() / w[mask].sum() == pytest.approx(0.4)
    assert w[(a == 0) & (y == 1)][0] == pytest.approx((4 / 10) * (4 / 10) / (3 / 10))


@pytest.mark.parametrize("treatment", ["exponentiated_gradient", "threshold_optimizer"])
def test_fairlearn_treatments_load_back(treatment: str, data: pd.DataFrame) -> None:
    family = "decision_tree" if treatment == "exponentiated_gradient" else "logistic_regression"
    params = (
        ModelParams(max_depth=2, min_samples_leaf=40)
        if family == "decision_tree"
        else ModelParams()
    )
    analysis = ModelTraining(
        family=family,  # type: ignore[arg-type]
        target="approved",
        features=FEATURES,
        params=params,
        fairness=Fairness(protected="group", treatment=treatment),  # type: ignore[arg-type]
    )
    out = execute(analysis, data, applicants_metadata())
    assert out.fairness_predictor is not None and out.fairness is not None
    model = Predictor(public(out))
    _, test = _split(data, analysis)
    truth = data["approved"].astype(str).to_numpy()[test]
    predicted = np.asarray(model.predict(data.iloc[test]))
    assert np.mean(predicted == truth) == pytest.approx(out.metrics["accuracy"], abs=1e-12)


def test_a_multiclass_target_round_trips() -> None:
    census = generate_census(1200, seed=3)
    analysis = ModelTraining(
        family="gradient_boosting",
        target="employment",
        features=["age", "sex"],
        params=ModelParams(n_estimators=3, max_depth=2),
    )
    out = execute(analysis, census, census_metadata())
    assert out.model.per_stage == 4 and out.metrics["roc_auc"] is None
    model = Predictor(public(out))
    probs = model.predict_proba(census.head(20))
    assert all(len(p) == 4 and sum(p) == pytest.approx(1.0) for p in probs)


def test_validation_refuses_what_the_analysis_alone_decides() -> None:
    meta = applicants_metadata()
    bad = [
        ModelTraining(family="decision_tree", target="income", features=["age"]),
        ModelTraining(family="decision_tree", target="approved", features=["approved"]),
        ModelTraining(
            family="decision_tree", target="approved", features=["age"], params=ModelParams(C=1.0)
        ),
        ModelTraining(
            family="logistic_regression",
            target="approved",
            features=["age"],
            params=ModelParams(max_depth=3),
        ),
        ModelTraining(family="decision_tree", target="approved", features=["applicant_id"]),
    ]
    for analysis in bad:
        with pytest.raises(AnalysisInvalid):
            validate(analysis, meta)
    validate(ModelTraining(family="decision_tree", target="approved", features=FEATURES), meta)


def test_the_predictor_refuses_other_outputs() -> None:
    with pytest.raises(ModelFormatError):
        Predictor({"type": "table"})


def test_a_fairness_report_admits_the_test_split_by_protected_group(data: pd.DataFrame) -> None:
    analysis = ModelTraining(
        family="logistic_regression",
        target="approved",
        features=FEATURES,
        params=ModelParams(),
        fairness=Fairness(protected="group", treatment="reweighing"),
    )
    out = execute(analysis, data, applicants_metadata())
    _, test = _split(data, analysis)
    cells = out.facts.query_set.to_array()  # type: ignore[union-attr]
    got = {frozenset(np.flatnonzero(cells == c).tolist()) for c in np.unique(cells[test])}
    expected = {
        frozenset(data.index[test][data["group"].iloc[test] == g].tolist())
        for g in data["group"].iloc[test].unique()
    }
    assert got == expected
