"""Test metrics, fairness on the test split, and the membership-inference attacks the runner
runs on the real records before a model may leave.

Membership inference asks whether a given record was in the training set. Two attacks, both
given every training and test record with its true label (the strongest attacker):

- loss attack (Yeom et al. 2018): the per-record loss -log p(true class) is lower on training
  records when a model memorises them; its AUC for telling training from test records (Mann-
  Whitney, with a one-sided p-value) is the attack's success.
- worst-case attack (SACRO-ML's `WorstCaseAttack`): an attack classifier (a random forest with
  SACRO-ML's defaults: min_samples_split 20, min_samples_leaf 10, max_depth 5) is trained on the
  predicted probabilities sorted in descending order, labelled member / non-member, on a
  stratified 80 % of them and scored on the other 20 %; repeated with `REPS` seeds. Mean and
  largest AUC are reported.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from safeaccess.client.analyses import Fairness
from safeaccess.rules.outputs import (
    FairnessFacts,
    FairnessGroup,
    FairnessReport,
    Label,
    MembershipFacts,
)

REPS = 5
TEST_PROP = 0.2
# The attack sees at most this many records of each side (the attack's cost must stay bounded
# on large datasets; a sample of this size measures an AUC to about +-0.01).
MAX_ATTACK_RECORDS = 20_000


def test_metrics(y: np.ndarray, proba: np.ndarray, n_classes: int) -> dict[str, float | None]:
    """Accuracy, balanced accuracy and (two classes) ROC AUC on the test split."""
    from sklearn.metrics import accuracy_score, balanced_accuracy_score, roc_auc_score

    predicted = np.argmax(proba, axis=1)
    out: dict[str, float | None] = {
        "accuracy": float(accuracy_score(y, predicted)),
        "balanced_accuracy": float(balanced_accuracy_score(y, predicted)),
        "roc_auc": None,
    }
    if n_classes == 2 and len(np.unique(y)) == 2:
        out["roc_auc"] = float(roc_auc_score(y, proba[:, 1]))
    return out


def _loss(y: np.ndarray, proba: np.ndarray) -> np.ndarray:
    picked = proba[np.arange(len(y)), y]
    return -np.log(np.clip(picked, 1e-12, 1.0))


def _sample(n: int, rng: np.random.Generator) -> np.ndarray:
    if n <= MAX_ATTACK_RECORDS:
        return np.arange(n)
    return np.sort(rng.choice(n, size=MAX_ATTACK_RECORDS, replace=False))


def membership(
    y_train: np.ndarray,
    proba_train: np.ndarray,
    y_test: np.ndarray,
    proba_test: np.ndarray,
    seed: int,
) -> MembershipFacts:
    """Both attacks' AUCs (see the module docstring)."""
    from scipy.stats import mannwhitneyu
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import train_test_split

    rng = np.random.default_rng(seed)
    tr = _sample(len(y_train), rng)
    te = _sample(len(y_test), rng)
    loss_train = _loss(y_train[tr], proba_train[tr])
    loss_test = _loss(y_test[te], proba_test[te])
    member = np.concatenate([np.ones(len(tr)), np.zeros(len(te))])
    # A lower loss means "member": score = -loss.
    loss_auc = float(roc_auc_score(member, -np.concatenate([loss_train, loss_test])))
    p_value: float | None
    try:
        p_value = float(mannwhitneyu(loss_test, loss_train, alternative="greater").pvalue)
    except ValueError:
        p_value = None
    features = -np.sort(-np.vstack([proba_train[tr], proba_test[te]]), axis=1)
    aucs: list[float] = []
    for rep in range(REPS):
        try:
            a_train, a_test, m_train, m_test = train_test_split(
                features, member, test_size=TEST_PROP, stratify=member, random_state=rep
            )
        except ValueError:
            break
        attack = RandomForestClassifier(
            min_samples_split=20, min_samples_leaf=10, max_depth=5, random_state=rep, n_jobs=1
        )
        attack.fit(a_train, m_train)
        scores = attack.predict_proba(a_test)
        positive = list(attack.classes_).index(1.0) if 1.0 in attack.classes_ else None
        if positive is None or len(np.unique(m_test)) < 2:
            continue
        aucs.append(float(roc_auc_score(m_test, scores[:, positive])))
    train_accuracy = float(np.mean(np.argmax(proba_train, axis=1) == y_train))
    test_accuracy = float(np.mean(np.argmax(proba_test, axis=1) == y_test)) if len(y_test) else None
    return MembershipFacts(
        n_train=len(y_train),
        n_test=len(y_test),
        loss_auc=loss_auc,
        loss_auc_p_value=p_value,
        worst_case_auc=float(np.mean(aucs)) if aucs else 0.5,
        worst_case_auc_max=max(aucs) if aucs else None,
        worst_case_reps=len(aucs),
        train_accuracy=train_accuracy,
        test_accuracy=test_accuracy,
    )


def _group_stats(y: np.ndarray, predicted: np.ndarray) -> dict[str, int]:
    return {
        "n": len(y),
        "positives": int((y == 1).sum()),
        "predicted_positive": int((predicted == 1).sum()),
        "true_positive": int(((predicted == 1) & (y == 1)).sum()),
        "false_positive": int(((predicted == 1) & (y == 0)).sum()),
    }


def fairness(
    spec: Fairness,
    y_test: np.ndarray,
    proba_test: np.ndarray,
    protected_test: np.ndarray,
    protected_train: np.ndarray,
    levels: list[Label],
) -> tuple[FairnessFacts, FairnessReport]:
    """Facts (group counts and confusion counts, for the checks) and the fairness report over
    every group (fairlearn's metrics); the rules narrow the released report to the groups with
    enough test records before it leaves."""
    from fairlearn.metrics import (
        demographic_parity_difference,
        equalized_odds_difference,
        selection_rate,
    )

    predicted = np.argmax(proba_test, axis=1)
    names = [str(level) for level in levels]
    groups: list[FairnessGroup] = []
    stats: dict[str, dict[str, int]] = {}
    for code, level in enumerate(levels):
        # every declared level, even one without test records: leaving it out would tell that
        # the group is empty (the rules blank every group below the threshold alike)
        mask = protected_test == code
        stats[str(level)] = _group_stats(y_test[mask], predicted[mask])
        rate = (
            float(selection_rate(y_test[mask], predicted[mask], pos_label=1))
            if mask.any()
            else None
        )
        groups.append(FairnessGroup(level=level, selection_rate=rate))
    sensitive = np.asarray([names[c] for c in protected_test], dtype=object)
    dp: float | None
    eo: float | None
    try:
        dp = float(demographic_parity_difference(y_test, predicted, sensitive_features=sensitive))
        eo = float(equalized_odds_difference(y_test, predicted, sensitive_features=sensitive))
    except (ValueError, ZeroDivisionError):
        dp = eo = None
    facts = FairnessFacts(
        group_test_counts={k: v["n"] for k, v in stats.items()},
        group_train_counts={
            names[c]: int((protected_train == c).sum())
            for c in range(len(levels))
            if (protected_train == c).any()
        },
        group_confusion=stats,
        all_groups_demographic_parity_difference=_finite(dp),
        all_groups_equalized_odds_difference=_finite(eo),
    )
    report = FairnessReport(
        protected=spec.protected,
        treatment=spec.treatment,
        constraint=spec.constraint,
        demographic_parity_difference=_finite(dp),
        equalized_odds_difference=_finite(eo),
        groups=groups,
    )
    return facts, report


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    v = float(value)
    return v if np.isfinite(v) else None
