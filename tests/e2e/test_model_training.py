"""Model training end to end: the real server (process sandbox), the real client, a generated
credit dataset. Released models load back into the client's predictor, which must reproduce the
released test metrics on the test split this test recomputes from the data (as docs/models.md
says the runner draws it); disclosive models are withheld for the reasons a checker sees.

The attacks (a researcher trying to learn about individuals from trained models) are written
against the release rules: an overfit tree (small, pure leaves; membership inference), and two
models whose training sets differ by one record (differencing per-leaf counts).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Centre
from sklearn.metrics import accuracy_score, balanced_accuracy_score, roc_auc_score
from sklearn.model_selection import train_test_split

from safeaccess.client.analyses import Analysis, Fairness, ModelParams, ModelTraining
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.models import Predictor
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.server.config import DataDir, QssSettings
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo.applicants import applicants_metadata, generate_applicants
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store import Store

DATASET = "applicants"
FEATURES = ["age", "income", "region", "group"]
_FRESH = itertools.count(1)


@pytest.fixture(scope="module")
def centre(centre: Centre) -> Iterator[Centre]:
    """The shared test centre plus the applicants dataset, audited per researcher (each test
    runs as a fresh researcher, so that one test's releases do not constrain another's)."""
    data = DataDir(centre.root)
    config = data.load_config()
    store = Store(data.database_url(config))
    try:
        register_dataset(
            data,
            store,
            name=DATASET,
            frame=generate_applicants(),
            metadata=applicants_metadata(DATASET),
            project="p1",
            qss=QssSettings(scope="researcher"),
        )
    finally:
        store.close()
    yield centre


@pytest.fixture(scope="module")
def applicants() -> pd.DataFrame:
    return generate_applicants()


def _run(
    centre: Centre, server: tuple[Service, EmbeddedServer], analyses: list[Analysis]
) -> list[StepResult]:
    service, srv = server
    name = f"modeller{next(_FRESH)}"
    key = Ed25519PrivateKey.generate()
    service.store.add_researcher(
        name, public_key_text(key.public_key()), fingerprint(key.public_key()), ["p1"]
    )
    centre.keys[name] = key
    with connect(srv.url, key, name) as session:
        return session.run(centre.seal(analyses, researcher=name, dataset=DATASET))


def _findings(service: Service, result: StepResult) -> list[dict[str, object]]:
    """The decision's findings as an output checker and the audit log see them."""
    step = next(s for s in service.store.steps(result.sequence_id) if s.index == result.index)
    assert step.decision is not None
    findings: list[dict[str, object]] = step.decision["findings"]
    return findings


def _withheld_by(service: Service, result: StepResult) -> set[str]:
    return {str(f["check"]) for f in _findings(service, result) if f["verdict"] == "withhold"}


def _test_split(frame: pd.DataFrame, analysis: ModelTraining) -> pd.DataFrame:
    """The test records, drawn as docs/models.md states: complete records in stored order, the
    target coded by its declared levels, train_test_split(stratify=target)."""
    columns = [analysis.target, *analysis.features]
    if analysis.fairness is not None:
        columns.append(analysis.fairness.protected)
    complete = frame.dropna(subset=columns).reset_index(drop=True)
    y = complete[analysis.target].astype(str).map({"no": 0, "yes": 1}).to_numpy()
    _, test = train_test_split(
        np.arange(len(complete)),
        test_size=analysis.test_fraction,
        random_state=analysis.seed,
        stratify=y,
    )
    return complete.iloc[np.asarray(test)]


def _check_metrics(model: Predictor, test: pd.DataFrame, released: dict[str, float]) -> None:
    truth = test["approved"].astype(str).to_list()
    predicted = model.predict(test)
    proba = np.asarray(model.predict_proba(test))
    assert accuracy_score(truth, predicted) == pytest.approx(released["accuracy"], abs=1e-12)
    assert balanced_accuracy_score(truth, predicted) == pytest.approx(
        released["balanced_accuracy"], abs=1e-12
    )
    y = np.asarray([1 if t == "yes" else 0 for t in truth])
    assert roc_auc_score(y, proba[:, 1]) == pytest.approx(released["roc_auc"], abs=1e-9)


def test_a_shallow_tree_with_reweighing_is_released_with_its_fairness_report_and_loads_back(
    centre: Centre, server: tuple[Service, EmbeddedServer], applicants: pd.DataFrame
) -> None:
    analysis = ModelTraining(
        family="decision_tree",
        target="approved",
        features=FEATURES,
        params=ModelParams(max_depth=3, min_samples_leaf=50),
        fairness=Fairness(protected="group", treatment="reweighing"),
        seed=3,
    )
    (result,) = _run(centre, server, [analysis])
    assert result.released, result.describe()
    out = result.output
    assert out is not None and "facts" not in out
    assert out["type"] == "model" and out["classes"] == ["no", "yes"]
    # the feature encoding uses the declared levels
    encoded = {f["name"]: f for f in out["features"]}
    assert encoded["region"]["levels"] == ["North", "South", "East", "West"]
    assert encoded["group"]["columns"] == ["group=A", "group=B", "group=C", "group=D"]
    tree = out["model"]["trees"][0]
    leaves = [i for i, left in enumerate(tree["left"]) if left == -1]
    assert 2 <= len(leaves) <= 8
    assert all(sum(tree["counts"][i]) >= 50 for i in leaves)
    # the fairness report: group D has fewer than 10 test records, so no rate for it
    test = _test_split(applicants, analysis)
    report = out["fairness"]
    assert report["protected"] == "group" and report["treatment"] == "reweighing"
    rates = {g["level"]: g["selection_rate"] for g in report["groups"]}
    sizes = test["group"].astype(str).value_counts()
    for level, rate in rates.items():
        assert (rate is None) == (sizes.get(level, 0) < 10), (level, sizes.get(level, 0))
    model = result.model()
    assert isinstance(model, Predictor)
    # demographic parity difference over the reported groups, recomputed by the test
    predicted = np.asarray(model.predict(test)) == "yes"
    groups = test["group"].astype(str).to_numpy()
    shown = [lv for lv, r in rates.items() if r is not None]
    selection = {lv: predicted[groups == lv].mean() for lv in shown}
    for lv in shown:
        assert rates[lv] == pytest.approx(selection[lv], abs=1e-12)
    assert report["demographic_parity_difference"] == pytest.approx(
        max(selection.values()) - min(selection.values()), abs=1e-12
    )
    assert report["equalized_odds_difference"] is not None
    _check_metrics(model, test, out["metrics"])
    # the fairness finding is recorded for checkers with the numbers
    fairness = [f for f in _findings(server[0], result) if f["check"] == "fairness"]
    assert fairness and fairness[0]["verdict"] == "release"


def test_a_deep_overfit_tree_is_withheld_for_small_leaves_and_membership_inference(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    analysis = ModelTraining(family="decision_tree", target="approved", features=FEATURES)
    (result,) = _run(centre, server, [analysis])
    assert result.withheld, result.describe()
    assert result.output is None
    # the researcher sees the one uniform reason
    assert [r.check for r in result.reasons] == ["disclosure_control"]
    # the checker sees why, with the facts
    causes = _withheld_by(server[0], result)
    assert {"leaf_threshold", "leaf_class_disclosure", "membership_inference"} <= causes
    (mia,) = [f for f in _findings(server[0], result) if f["check"] == "membership_inference"]
    message = str(mia["message"])
    loss_auc = float(message.split("loss attack ")[1].split(",")[0])
    assert loss_auc > 0.6
    step = next(s for s in server[0].store.steps(result.sequence_id) if s.index == result.index)
    assert step.output is not None
    membership = step.output["facts"]["membership"]
    assert membership["loss_auc"] == pytest.approx(loss_auc, abs=1e-3)
    assert membership["train_accuracy"] == pytest.approx(1.0)
    # the audit log keeps what the checks compared, not records
    (event,) = [e for e in server[0].store.events(result.sequence_id) if e.kind == "checks"]
    facts = event.data["facts"]
    assert facts["output"] == "model" and facts["smallest_leaf"] == [1]
    assert facts["largest_class_share"] == 1.0
    assert facts["membership"]["loss_auc"] == pytest.approx(loss_auc, abs=1e-3)


def test_logistic_regression_is_released_with_coefficients(
    centre: Centre, server: tuple[Service, EmbeddedServer], applicants: pd.DataFrame
) -> None:
    analysis = ModelTraining(
        family="logistic_regression", target="approved", features=["age", "income", "region"]
    )
    (result,) = _run(centre, server, [analysis])
    assert result.released, result.describe()
    assert result.output is not None
    spec = result.output["model"]
    assert len(spec["coefficients"]) == 1 and len(spec["coefficients"][0]) == 2 + 4
    assert len(spec["intercept"]) == 1
    # income raises approval in the generated data
    assert spec["coefficients"][0][1] > 0
    model = result.model()
    _check_metrics(model, _test_split(applicants, analysis), result.output["metrics"])


@pytest.mark.parametrize(
    ("family", "params"),
    [
        ("random_forest", ModelParams(n_estimators=4, max_depth=2, min_samples_leaf=150)),
        (
            "gradient_boosting",
            ModelParams(n_estimators=5, max_depth=2, min_samples_leaf=150, learning_rate=0.3),
        ),
    ],
)
def test_forests_and_boosting_round_trip(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    applicants: pd.DataFrame,
    family: str,
    params: ModelParams,
) -> None:
    # Integer ages and declared regions: every tree splits between whole ages, so the leaves of
    # different trees intersect in groups of many records. (On a continuous feature such as
    # income, two trees' nearby thresholds leave a few records between them, and the auditor
    # refuses the forest: the difference of the two leaves' class counts is their classes.)
    analysis = ModelTraining(
        family=family,  # type: ignore[arg-type]
        target="approved",
        features=["age", "region"],
        params=params,
    )
    (result,) = _run(centre, server, [analysis])
    assert result.released, (result.describe(), _findings(server[0], result))
    assert result.output is not None
    assert len(result.output["model"]["trees"]) == 4 if family == "random_forest" else 5
    _check_metrics(result.model(), _test_split(applicants, analysis), result.output["metrics"])


def test_two_models_differing_by_one_record_do_not_give_its_class(
    centre: Centre, server: tuple[Service, EmbeddedServer], applicants: pd.DataFrame
) -> None:
    """Differencing: a stump on everyone, then the same stump without one person (picked by a
    unique age and income). Together the two models' query sets (their leaves and test splits
    cover every selected record) determine an aggregate over that one person. The random split
    differs between the two selections, so the naive difference of the leaf counts is blurred
    (measured: it is not her class on this data), but nothing guarantees that for every
    statistic released: the query-set auditor refuses the second model."""
    person = applicants.sort_values("income").iloc[-1]
    where = f"age != {int(person['age'])} or income < {float(person['income'])}"
    params = ModelParams(max_depth=1, min_samples_leaf=200)
    first = ModelTraining(
        family="decision_tree",
        target="approved",
        features=["income"],
        params=params,
        test_fraction=0.5,
    )
    second = first.model_copy(update={"where": where})
    results = _run(centre, server, [first, second])
    assert results[0].released, results[0].describe()
    assert len(results) == 2
    second_result = results[1]
    if second_result.released:  # the leak the auditor must prevent
        a = results[0].output["model"]["trees"][0]["counts"]  # type: ignore[index]
        b = second_result.output["model"]["trees"][0]["counts"]  # type: ignore[index]
        diff = [
            [x - y for x, y in zip(ra, rb, strict=True)]
            for ra, rb in zip(a, b, strict=True)
            if ra is not None and rb is not None
        ]
        pytest.fail(f"two models one record apart were both released (difference {diff})")
    assert second_result.withheld
    assert "query_set" in _withheld_by(server[0], second_result), _findings(
        server[0], second_result
    )


def test_a_deep_tree_on_an_identifying_selection_does_not_give_ones_outcome(
    centre: Centre, server: tuple[Service, EmbeddedServer], applicants: pd.DataFrame
) -> None:
    """The researcher knows one applicant's age and income (the highest of the applicants
    aged 70 or more). A tree grown until its leaves are pure on that selection puts her in a
    pure leaf; were it released, the predictor would return her outcome with certainty."""
    old = applicants[applicants["age"] >= 70]
    person = old.sort_values("income").iloc[-1]
    analysis = ModelTraining(
        family="decision_tree",
        target="approved",
        features=["age", "income"],
        where="age >= 70",
        test_fraction=0.1,
    )
    (result,) = _run(centre, server, [analysis])
    if result.released:  # the leak
        record = {"age": int(person["age"]), "income": float(person["income"])}
        (probs,) = result.model().predict_proba([record])
        truth = ["no", "yes"].index(str(person["approved"]))
        assert probs[truth] < 1.0, "the applicant's outcome is read from her own leaf"
    assert result.withheld, result.describe()
    assert [r.check for r in result.reasons] == ["disclosure_control"]
    assert {"leaf_threshold", "leaf_class_disclosure"} <= _withheld_by(server[0], result)


def test_plan_train_model_is_sealed_run_and_released_through_the_session(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = server
    name = f"modeller{next(_FRESH)}"
    key = Ed25519PrivateKey.generate()
    service.store.add_researcher(
        name, public_key_text(key.public_key()), fingerprint(key.public_key()), ["p1"]
    )
    with connect(srv.url, key, name) as session:
        plan = session.plan(DATASET).train_model(
            "logistic_regression", "approved", ["age", "income", "region"], params={"C": 1.0}
        )
        assert plan.analyses[0] == ModelTraining(
            family="logistic_regression",
            target="approved",
            features=["age", "income", "region"],
            params=ModelParams(C=1.0),
        )
        (rehearsed,) = plan.rehearse(show=False).steps
        assert rehearsed.kind == "model_training" and not rehearsed.doomed
        assert rehearsed.mock_verdict in ("release", "withhold", "review")
        (result,) = session.run(session.seal(plan))
    assert result.released, result.describe()
    assert result.kind == "model_training" and result.model() is not None
    card = result.model()._repr_html_()
    assert 'data-safeaccess="model"' in card and "logistic_regression" in card
    metrics = result.frame()
    assert result.output is not None
    assert metrics.loc["n_test", "value"] == result.output["n_test"]
    assert metrics.loc["accuracy", "value"] == result.output["metrics"]["accuracy"]
