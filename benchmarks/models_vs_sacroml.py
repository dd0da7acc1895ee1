"""Our release checks for trained models next to SACRO-ML's, on identical models.

SACRO-ML (the `sacroml` package: safe model wrappers, structural and membership-inference
attacks) pulls in torch, so it never becomes a dependency of ours: it lives in its own virtual
environment, and this script drives that environment's python as a subprocess (this same file,
run with `--sacroml-worker`). Set it up once, outside the repository:

    python3 -m venv /tmp/sacroml-venv
    /tmp/sacroml-venv/bin/pip install torch==2.13.0     # a CPU build; sacroml accepts it
    /tmp/sacroml-venv/bin/pip install sacroml
    .venv/bin/python benchmarks/models_vs_sacroml.py --sacroml-python /tmp/sacroml-venv/bin/python

What it does:

1. Generates the census demo data (`safeaccess.server.demo.data`, seeded) with a 0/1 outcome
   `employed` ("yes" when employment is 'employed'), restricted to people under 66.
2. Trains four models with our runner's own code (`safeaccess.sandbox.runner.execute`, in
   process): a depth-3 tree meant for release, a logistic regression, an overfit deep tree and
   a random forest; checks each with our rules (`safeaccess.rules.engine.check`, the default
   rule set) and reads the runner's membership-inference AUCs (loss attack, worst-case attack).
3. Hands SACRO-ML exactly what the estimator saw: the encoded (for logistic regression,
   standardised) training and test matrices, the labels and scikit-learn's parameters of the
   estimator. The worker refits the same estimator class with the same parameters and seed (it
   refuses to run unless both environments have the same scikit-learn version) and checks that
   its predicted probabilities equal ours on every record, so both sides judge one model.
4. The worker runs SACRO-ML's safe-model rule check (`SafeDecisionTreeClassifier` /
   `SafeRandomForestClassifier` preliminary_check; none exists for logistic regression), its
   structural attack, its worst-case attack and LiRA (offline, `--shadow-models` shadow models)
   and its `FinalRecommendationModule` over both attacks' reports.
5. Prints both verdicts and AUCs side by side and a line explaining each disagreement.

SACRO-ML gives evidence rather than a verdict; the verdict printed for it here is "withhold" if
any of its evidence supports rejection: the safe-model rules are broken, the final
recommendation module scores above 0 (min_samples_leaf below its appetite, >10 % of attack AUCs
significant, mean significant AUC above 0.65), or the structural attack reports a k-anonymity,
class-disclosure or small-group risk. Its "unnecessary risk" and generalisation-gap flags are
printed but do not decide (SACRO-ML presents them as advice).

    python benchmarks/models_vs_sacroml.py --sacroml-python PATH [--rows 6000] [--seed 7]
        [--shadow-models 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MODELS: dict[str, dict[str, Any]] = {
    "tree, depth 3": {
        "family": "decision_tree",
        "params": {"max_depth": 3, "min_samples_leaf": 50},
    },
    "logistic regression": {"family": "logistic_regression", "params": {"C": 1.0}},
    "tree, overfit": {"family": "decision_tree", "params": {"min_samples_leaf": 1}},
    "random forest": {
        "family": "random_forest",
        "params": {"n_estimators": 50, "max_depth": 8, "min_samples_leaf": 10},
    },
}
FEATURES = ["age", "health", "region", "sex", "ethnicity"]
WHERE = "age < 66"
SEED = 3


# --------------------------------------------------------------------------- SACRO-ML side


def _sacroml_worker(directory: Path) -> None:
    """Runs inside SACRO-ML's environment: refit each model, run its checks and attacks."""
    import logging
    import warnings

    import numpy as np
    import sklearn
    from sacroml.attacks.attack_report_formatter import FinalRecommendationModule
    from sacroml.attacks.likelihood_attack import LIRAAttack
    from sacroml.attacks.structural_attack import StructuralAttack
    from sacroml.attacks.target import Target
    from sacroml.attacks.worst_case_attack import WorstCaseAttack
    from sacroml.safemodel.classifiers import (
        SafeDecisionTreeClassifier,
        SafeRandomForestClassifier,
    )
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.tree import DecisionTreeClassifier

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    job = json.loads((directory / "job.json").read_text())
    if job["sklearn"] != sklearn.__version__:
        raise SystemExit(
            f"scikit-learn {sklearn.__version__} here, {job['sklearn']} on our side: install "
            "the same version in both environments so that both judge the same model"
        )
    classes = {
        "DecisionTreeClassifier": (DecisionTreeClassifier, SafeDecisionTreeClassifier),
        "RandomForestClassifier": (RandomForestClassifier, SafeRandomForestClassifier),
        "LogisticRegression": (LogisticRegression, None),
    }
    results = {}
    for name, model in job["models"].items():
        arrays = np.load(directory / f"{model['file']}.npz")
        cls, safe_cls = classes[model["estimator"]]
        estimator = cls(**model["params"])
        estimator.fit(arrays["x_train"], arrays["y_train"])
        same = max(
            float(np.max(np.abs(estimator.predict_proba(arrays["x_train"]) - arrays["p_train"]))),
            float(np.max(np.abs(estimator.predict_proba(arrays["x_test"]) - arrays["p_test"]))),
        )
        safe_rules: dict[str, Any] = {"checked": False}
        if safe_cls is not None:
            safe = safe_cls(**model["params"])
            msg, disclosive = safe.preliminary_check(verbose=False, apply_constraints=False)
            safe_rules = {"checked": True, "disclosive": bool(disclosive), "message": msg.strip()}
        target = Target(
            model=estimator,
            X_train=arrays["x_train"],
            y_train=arrays["y_train"],
            X_test=arrays["x_test"],
            y_test=arrays["y_test"],
        )
        out_dir = str(directory / f"out-{model['file']}")
        structural = StructuralAttack(output_dir=out_dir, write_report=False).attack(target)
        worst = WorstCaseAttack(
            output_dir=out_dir, write_report=False, n_reps=10, n_dummy_reps=1
        ).attack(target)
        lira = LIRAAttack(
            output_dir=out_dir, write_report=False, n_shadow_models=job["shadow_models"]
        ).attack(target)
        report = {
            "model_name": model["estimator"],
            "model_params": model["params"],
            "WorstCaseAttack": worst,
            "LIRAAttack": lira,
        }
        final = FinalRecommendationModule(report)
        final.process_dict()
        immediate, against, support = final.get_recommendation()

        def instances(output: dict[str, Any]) -> list[dict[str, Any]]:
            return list(output["attack_experiment_logger"]["attack_instance_logger"].values())

        worst_aucs = [float(i["AUC"]) for i in instances(worst)]
        worst_p = [float(i["P_HIGHER_AUC"]) for i in instances(worst)]
        (lira_instance,) = instances(lira)
        flags = structural["metadata"]["global_metrics"]
        results[name] = {
            "max_abs_proba_difference": same,
            "safe_rules": safe_rules,
            "structural": {k: bool(v) for k, v in flags.items() if k.endswith("_risk")},
            "generalisation_gap": float(flags["generalisation_gap"]),
            "worst_case_auc": float(np.mean(worst_aucs)),
            "worst_case_significant": sum(p < 0.05 for p in worst_p),
            "worst_case_reps": len(worst_aucs),
            "lira_auc": float(lira_instance["AUC"]),
            "lira_p": float(lira_instance["P_HIGHER_AUC"]),
            "recommendation_score": min(round(sum(final.scores)), 5),
            "against_release": [*immediate, *against],
            "for_release": support,
        }
    (directory / "sacroml.json").write_text(json.dumps(results, indent=1))


# -------------------------------------------------------------------------------- our side

DECIDING_FLAGS = ("k_anonymity_risk", "class_disclosure_risk", "smallgroup_risk")


def _sacroml_verdict(s: dict[str, Any]) -> tuple[str, list[str]]:
    reasons = []
    if s["safe_rules"].get("disclosive"):
        reasons.append("safe-model rules broken")
    if s["recommendation_score"] > 0:
        reasons += s["against_release"]
    reasons += [flag for flag in DECIDING_FLAGS if s["structural"].get(flag)]
    return ("withhold" if reasons else "release"), reasons


_OURS_EXPLAINED = {
    "leaf_threshold": "a leaf rests on fewer than the threshold (10) training records, where "
    "SACRO-ML's safe-model rule only asks min_samples_leaf >= 5",
    "leaf_class_disclosure": "a leaf is dominated by one class beyond 90 %, or holds no record "
    "of a class (zeros are disclosive, as in our table rules)",
    "membership_inference": "a membership-inference AUC (loss or worst-case attack) is above "
    "our limit of 0.6",
    "leverage": "a training record has leverage above 1/threshold: the model fits it as "
    "closely as a group of fewer than 10 records would (a rare level's one-hot column)",
    "dof": "too few residual degrees of freedom",
    "model_family": "the family embeds training records",
    "explainability": "the fitted model exceeds the centre's explainability limits",
}

_SACROML_EXPLAINED = {
    "class_disclosure_risk": "SACRO-ML's structural attack flags an equivalence class (a leaf; "
    "for other models, the records sharing one predicted probability vector) with a zero "
    "predicted probability for some class",
    "k_anonymity_risk": "SACRO-ML's structural attack flags an equivalence class of fewer than "
    "10 training records; for a logistic regression every distinct probability vector is a "
    "class, so continuous features always trip it (we bound leverage instead)",
    "smallgroup_risk": "SACRO-ML's structural attack flags an equivalence class where some "
    "class has between 0 and 10 records (we ask >= 10 records per leaf and no class share "
    "above 90 %)",
    "safe-model rules broken": "SACRO-ML's safe-model rules reject the hyper-parameters as set "
    "(min_samples_leaf < 5, a forest without bootstrap), before looking at the fitted model; "
    "we judge the fitted model",
}


def _explain(ours: dict[str, Any], sacro: dict[str, Any], sacro_reasons: list[str]) -> str:
    if ours["verdict"] == "withhold":
        why = "; ".join(_OURS_EXPLAINED.get(c, c) for c in ours["checks"]) or "withheld"
        return f"we withhold ({why}); SACRO-ML finds no evidence against release"
    parts = []
    for reason in sacro_reasons:
        text = _SACROML_EXPLAINED.get(reason)
        if text is None and "AUC" in reason:
            text = (
                f"SACRO-ML: {reason} (LiRA AUC {sacro['lira_auc']:.3f}, p={sacro['lira_p']:.2g}); "
                f"our worst-case/loss AUCs {ours['worst_case_auc']:.3f}/{ours['loss_auc']:.3f} "
                "stay under our limit, which bounds the size of the advantage rather than its "
                "statistical significance"
            )
        elif text is None:
            text = f"SACRO-ML: {reason}"
        parts.append(text)
    return f"{ours['verdict']} here, SACRO-ML would withhold: " + " | ".join(parts)


def _ours(rows: int, seed: int, directory: Path) -> dict[str, Any]:
    """Train and check each model with our code; write what SACRO-ML needs into `directory`."""
    import numpy as np
    import sklearn

    from safeaccess.client.analyses import ModelParams, ModelTraining
    from safeaccess.client.metadata import Column, DatasetMetadata
    from safeaccess.rules.engine import check
    from safeaccess.rules.outputs import ModelOutput
    from safeaccess.rules.ruleset import DEFAULT_RULESET
    from safeaccess.sandbox.runner import apply_filter, execute
    from safeaccess.sandbox.runner.compute import models as training
    from safeaccess.server.demo.data import census_metadata, generate_census

    frame = generate_census(rows, seed=seed)
    frame["employed"] = np.where(frame["employment"] == "employed", "yes", "no")
    base = census_metadata("census")
    metadata = DatasetMetadata(
        name="census",
        description=base.description,
        record_key=base.record_key,
        columns=[
            *base.columns,
            Column(name="employed", type="categorical", levels=["no", "yes"]),
        ],
    )
    stored = frame.drop(columns=[base.record_key]).reset_index(drop=True)
    job: dict[str, Any] = {"sklearn": sklearn.__version__, "models": {}}
    ours: dict[str, Any] = {}
    for number, (name, spec) in enumerate(MODELS.items()):
        analysis = ModelTraining(
            family=spec["family"],
            target="employed",
            features=FEATURES,
            params=ModelParams(**spec["params"]),
            where=WHERE,
            seed=SEED,
        )
        output = execute(analysis, stored, metadata)
        assert isinstance(output, ModelOutput)
        decision = check(output)
        member = output.facts.membership
        assert member is not None, "the runner always attacks a trained model"
        # What the estimator saw: the runner's own steps, redone with its own functions.
        selected = apply_filter(analysis, stored)
        x_all, _, complete = training.encode_features(selected, analysis, metadata)
        y_all = training.level_codes(selected["employed"], ["no", "yes"])
        rows_used = np.nonzero(complete & (y_all >= 0))[0]
        x, y = x_all[rows_used], y_all[rows_used]
        train, test = training.split_positions(y, analysis.test_fraction, analysis.seed)
        estimator, scaling, _ = training.fit(analysis, x[train], y[train], None)
        x_train, x_test = x[train], x[test]
        if scaling is not None:
            x_train = (x_train - scaling.mean) / scaling.scale
            x_test = (x_test - scaling.mean) / scaling.scale
        p_train = estimator.predict_proba(x_train)
        p_test = estimator.predict_proba(x_test)
        accuracy = float(np.mean(np.argmax(p_test, axis=1) == y[test]))
        released_accuracy = output.metrics["accuracy"]
        assert released_accuracy is not None and abs(accuracy - released_accuracy) < 1e-12, (
            "the refit differs from the runner's model"
        )
        file = f"model{number}"
        np.savez(
            directory / f"{file}.npz",
            x_train=x_train,
            y_train=y[train],
            x_test=x_test,
            y_test=y[test],
            p_train=p_train,
            p_test=p_test,
        )
        params = {k: v for k, v in estimator.get_params().items() if not callable(v)}
        job["models"][name] = {
            "file": file,
            "estimator": type(estimator).__name__,
            "params": params,
        }
        failing = sorted({f.check for f in decision.findings if f.verdict != "release"})
        ours[name] = {
            "verdict": decision.verdict,
            "checks": failing,
            "loss_auc": member.loss_auc,
            "worst_case_auc": member.worst_case_auc,
            "train_accuracy": member.train_accuracy,
            "test_accuracy": member.test_accuracy,
            "n_train": output.n_train,
            "auc_limit": DEFAULT_RULESET.model_mia_auc_limit,
        }
    (directory / "job.json").write_text(json.dumps(job))
    return ours


def _print(ours: dict[str, Any], sacro: dict[str, Any]) -> None:
    header = (
        f"{'model':<20} {'ours':<9} {'loss AUC':>8} {'wc AUC':>7} | {'SACRO-ML':<9} "
        f"{'wc AUC':>7} {'sig':>5} {'LiRA AUC':>8} {'LiRA p':>8} {'score':>5}  same model"
    )
    print(header)
    print("-" * len(header))
    notes = []
    for name, o in ours.items():
        s = sacro[name]
        verdict, reasons = _sacroml_verdict(s)
        print(
            f"{name:<20} {o['verdict']:<9} {o['loss_auc']:>8.3f} {o['worst_case_auc']:>7.3f} | "
            f"{verdict:<9} {s['worst_case_auc']:>7.3f} "
            f"{s['worst_case_significant']:>2}/{s['worst_case_reps']:<2} {s['lira_auc']:>8.3f} "
            f"{s['lira_p']:>8.2g} {s['recommendation_score']:>5}  "
            f"max |dp| = {s['max_abs_proba_difference']:.1e}"
        )
        flags = [k for k, v in s["structural"].items() if v]
        detail = (
            f"    ours: train/test accuracy {o['train_accuracy']:.3f}/{o['test_accuracy']:.3f}, "
            f"failing checks: {', '.join(o['checks']) or 'none'}; SACRO-ML structural flags: "
            f"{', '.join(flags) or 'none'}; safe-model rules: "
            + (
                ("broken" if s["safe_rules"]["disclosive"] else "kept")
                if s["safe_rules"]["checked"]
                else "no safe wrapper for this family"
            )
        )
        print(detail)
        if reasons:
            print(f"    SACRO-ML against release: {'; '.join(reasons)}")
        if verdict != o["verdict"] and not (o["verdict"] == "review" and verdict == "withhold"):
            notes.append(f"{name}: {_explain(o, s, reasons)}")
    print()
    weaker = []
    for name, o in ours.items():
        s = sacro[name]
        theirs = max(s["worst_case_auc"], s["lira_auc"])
        mine = max(o["loss_auc"], o["worst_case_auc"])
        if theirs > o["auc_limit"] >= mine:
            weaker.append(
                f"{name}: SACRO-ML's {'LiRA' if s['lira_auc'] >= s['worst_case_auc'] else 'worst-case'}"
                f" attack reaches AUC {theirs:.3f}, above our limit {o['auc_limit']}, while our "
                f"attacks reach {mine:.3f}: our membership check alone would not withhold it"
            )
    if weaker:
        print("Where SACRO-ML's attacks are stronger than ours:")
        for note in weaker:
            print(f"  - {note}")
        print()
    if notes:
        print("Disagreements:")
        for note in notes:
            print(f"  - {note}")
    else:
        print("No disagreements.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sacroml-python", help="python of the environment holding sacroml")
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--shadow-models", type=int, default=20)
    parser.add_argument("--sacroml-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sacroml_worker is not None:
        _sacroml_worker(args.sacroml_worker)
        return
    if not args.sacroml_python:
        parser.error("--sacroml-python is required (see the module docstring to set it up)")
    with tempfile.TemporaryDirectory(prefix="models-vs-sacroml-") as tmp:
        directory = Path(tmp)
        ours = _ours(args.rows, args.seed, directory)
        job = json.loads((directory / "job.json").read_text())
        job["shadow_models"] = args.shadow_models
        (directory / "job.json").write_text(json.dumps(job))
        # SACRO-ML's safe models print their parameter checks: keep its chatter off the table.
        worker = subprocess.run(
            [args.sacroml_python, __file__, "--sacroml-worker", str(directory)],
            cwd=directory,
            capture_output=True,
            text=True,
        )
        if worker.returncode != 0:
            sys.stderr.write(worker.stdout + worker.stderr)
            raise SystemExit(f"the SACRO-ML worker failed (exit {worker.returncode})")
        sacro = json.loads((directory / "sacroml.json").read_text())
    print(
        f"census demo, {args.rows} rows (seed {args.seed}), people under 66, target employed, "
        f"features {', '.join(FEATURES)}; SACRO-ML LiRA with {args.shadow_models} shadow models"
    )
    print()
    _print(ours, sacro)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
