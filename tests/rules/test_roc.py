"""The coarsened ROC curve against scikit-learn and hand counts, and its rule check."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_curve

from safeaccess.rules.checks.models import _roc
from safeaccess.rules.engine import DEFAULT_RULESET
from safeaccess.rules.outputs import ModelFacts, ModelOutput, RocStep
from safeaccess.sandbox.runner.compute.roc import coarse_roc


def _scores(n: int = 500, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    return y, np.round(rng.normal(y * 0.8, 1.0), 2)  # ties on purpose


def test_points_are_on_the_full_curve_and_bands_are_the_steps() -> None:
    y, score = _scores()
    roc = coarse_roc(y, score)
    assert roc is not None
    fpr, tpr, _ = roc_curve(y, score, drop_intermediate=False)
    full = set(zip(fpr.round(12), tpr.round(12), strict=True))
    assert all((round(p.fpr, 12), round(p.tpr, 12)) in full for p in roc.points)
    assert (roc.points[0].fpr, roc.points[0].tpr) == (0.0, 0.0)
    assert (roc.points[-1].fpr, roc.points[-1].tpr) == (1.0, 1.0)
    step = max(10, -(-min(int(y.sum()), int((1 - y).sum())) // 20))
    for s in roc.steps:
        assert s.true_positives >= step and s.false_positives >= step
    # each record's band holds exactly the step's counts (the auditor's cells)
    for j, s in enumerate(roc.steps):
        assert int(((roc.band == j) & (y == 1)).sum()) == s.true_positives
        assert int(((roc.band == j) & (y == 0)).sum()) == s.false_positives


def test_too_few_of_a_class_gives_no_curve() -> None:
    y = np.array([1] * 9 + [0] * 200)
    assert coarse_roc(y, np.linspace(0, 1, len(y))) is None


def test_check_withholds_a_step_below_threshold() -> None:
    facts = ModelFacts.model_construct(
        roc_steps=[
            RocStep(true_positives=30, false_positives=12),
            RocStep(true_positives=4, false_positives=40),
        ]
    )
    output = ModelOutput.model_construct(roc=[object(), object(), object()], facts=facts)
    found = _roc(output, DEFAULT_RULESET)
    assert [(f.check, f.item, f.verdict) for f in found] == [("roc", "ROC step 2", "withhold")]


def test_the_runner_hands_each_roc_step_to_the_auditor() -> None:
    from safeaccess.client.analyses import ModelTraining
    from safeaccess.rules.outputs import extra_query_sets_of
    from safeaccess.sandbox.runner import execute
    from safeaccess.server.demo.applicants import applicants_metadata, generate_applicants

    frame = generate_applicants()
    analysis = ModelTraining(
        family="logistic_regression",
        target="approved",
        features=["age", "income", "region"],
        roc=True,
    )
    out = execute(analysis, frame, applicants_metadata("applicants"))
    assert isinstance(out, ModelOutput) and out.roc is not None
    assert out.facts.roc_steps is not None
    (roc_set,) = [q for q in extra_query_sets_of(out) if q.labels[0].startswith("ROC step")]
    cells = roc_set.to_array()
    counts = np.bincount(cells[cells >= 0], minlength=len(roc_set.labels))
    expected = [n for s in out.facts.roc_steps for n in (s.false_positives, s.true_positives)]
    assert counts.tolist() == expected
    assert int((cells >= 0).sum()) == out.n_test  # the test records, every one in a step
    # released points are the cumulative steps over the class sizes
    positives = sum(s.true_positives for s in out.facts.roc_steps)
    assert [round(p.tpr * positives) for p in out.roc[1:]] == list(
        np.cumsum([s.true_positives for s in out.facts.roc_steps])
    )
