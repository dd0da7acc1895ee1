"""ROC curves of released models through the real server and client: `train_model(...,
roc=True)` releases a coarsened curve whose points lie on the ROC the released model gives on
its test split (recomputed here with scikit-learn from the released model), every step adding
at least 10 records of each class; a centre whose threshold is higher withholds it; the curve
plots from the released points only."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Centre
from sklearn.metrics import roc_curve
from sklearn.model_selection import train_test_split

from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.server.config import DataDir, QssSettings
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo.applicants import applicants_metadata, generate_applicants
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store import Store

FEATURES = ["age", "income", "region"]
_FRESH = itertools.count(1)


@pytest.fixture(scope="module")
def centre(centre: Centre, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Centre]:
    data = DataDir(centre.root)
    strict = tmp_path_factory.mktemp("rules") / "strict.yaml"
    strict.write_text("threshold: 200\n")
    store = Store(data.database_url(data.load_config()))
    try:
        for name, rules in (("applicants", None), ("applicants_strict", strict)):
            register_dataset(
                data,
                store,
                name=name,
                frame=generate_applicants(),
                metadata=applicants_metadata(name),
                project="p1",
                rules_file=rules,
                qss=QssSettings(scope="researcher"),
            )
    finally:
        store.close()
    yield centre


def _train(
    centre: Centre, server: tuple[Service, EmbeddedServer], dataset: str, roc: bool = True
) -> StepResult:
    service, srv = server
    name = f"roc{next(_FRESH)}"
    key = Ed25519PrivateKey.generate()
    service.store.add_researcher(
        name, public_key_text(key.public_key()), fingerprint(key.public_key()), ["p1"]
    )
    with connect(srv.url, key, name) as session:
        plan = session.plan(dataset).train_model(
            "logistic_regression", "approved", FEATURES, roc=roc
        )
        (result,) = session.run(session.seal(plan))
    return result


def _test_split() -> pd.DataFrame:
    """The test records as docs/models.md states the split (complete records, stratified)."""
    frame = generate_applicants().dropna(subset=["approved", *FEATURES]).reset_index(drop=True)
    y = frame["approved"].astype(str).map({"no": 0, "yes": 1}).to_numpy()
    _, test = train_test_split(np.arange(len(frame)), test_size=0.3, random_state=0, stratify=y)
    return frame.iloc[np.asarray(test)]


def test_released_roc_lies_on_the_models_test_roc_in_steps_of_ten(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    result = _train(centre, server, "applicants")
    assert result.released, result.describe()
    curve = result.roc()
    assert list(curve.columns) == ["fpr", "tpr"]
    assert tuple(curve.iloc[0]) == (0.0, 0.0) and tuple(curve.iloc[-1]) == (1.0, 1.0)
    # the full ROC of the released model on its test split, from released numbers only
    test = _test_split()
    y = (test["approved"].astype(str) == "yes").to_numpy().astype(int)
    scores = np.asarray(result.model().predict_proba(test))[:, 1]
    fpr, tpr, _ = roc_curve(y, scores, drop_intermediate=False)
    full = set(zip(np.round(fpr, 12), np.round(tpr, 12), strict=True))
    for point in curve.itertuples():
        assert (round(point.fpr, 12), round(point.tpr, 12)) in full
    positives, negatives = int(y.sum()), int((1 - y).sum())
    step = max(10, -(-min(positives, negatives) // 20))
    added_tp = np.diff(np.rint(curve.tpr.to_numpy() * positives))
    added_fp = np.diff(np.rint(curve.fpr.to_numpy() * negatives))
    assert (added_tp >= step).all() and (added_fp >= step).all()
    assert 2 <= len(curve) <= 22
    # nothing finer than the steps travels: no thresholds (they are test records' scores)
    assert result.output is not None
    assert all(set(p) == {"fpr", "tpr"} for p in result.output["roc"])


def test_roc_is_only_released_when_asked(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    result = _train(centre, server, "applicants", roc=False)
    assert result.released, result.describe()
    assert result.output is not None and result.output["roc"] is None
    with pytest.raises(ValueError, match="roc=True"):
        result.roc()


def test_a_roc_coarser_than_the_centres_threshold_is_withheld(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    service, _ = server
    result = _train(centre, server, "applicants_strict")
    assert result.withheld and result.output is None
    step = service.store.get_step(result.sequence_id, result.index)
    assert step is not None and step.decision is not None
    roc = [f for f in step.decision["findings"] if f["check"] == "roc"]
    assert roc and all(f["verdict"] == "withhold" for f in roc)


def test_roc_plots_the_released_points(
    centre: Centre, server: tuple[Service, EmbeddedServer], tmp_path: Path
) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = _train(centre, server, "applicants")
    assert result.released, result.describe()
    ax = result.plot()
    curve = result.roc()
    assert list(ax.lines[0].get_xdata()) == curve.fpr.tolist()
    assert list(ax.lines[0].get_ydata()) == curve.tpr.tolist()
    assert ax.get_xlabel() == "false positive rate"
    ax.figure.savefig(tmp_path / "roc.png")
    assert (tmp_path / "roc.png").stat().st_size > 1000
    plt.close("all")


def test_roc_of_a_target_with_more_than_two_classes_is_refused_in_the_plan(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    from safeaccess.client.validation import AnalysisInvalid

    with connect(server[1].url, centre.keys["ada"], "ada") as session:
        plan = session.plan("applicants")
        with pytest.raises(AnalysisInvalid, match="ROC curve needs a target with two classes"):
            plan.train_model("decision_tree", "region", ["age", "income"], roc=True)
        assert len(plan) == 0
        plan.train_model("decision_tree", "region", ["age", "income"])  # fine without roc
        assert len(plan) == 1
