"""The rule-checked kinds through the real server and client against the ecosystem's reference
on the raw records: pandas (crosstab, groupby), statsmodels (OLS, logit, probit, Poisson),
scipy.stats (chi², Welch's t), lifelines (Kaplan-Meier with Greenwood's variance). Each is
released and equal to the reference up to floating-point rounding (rel 1e-9 unless said)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from fidelity_data import Fidelity

from safeaccess.client.analyses import (
    Analysis,
    Correlation,
    FrequencyTable,
    Histogram,
    MagnitudeTable,
    ModelTraining,
    Regression,
    StatTest,
    Summary,
    Survival,
)
from safeaccess.client.protocol import canonical, seal
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect


def _released(results: list[StepResult]) -> list[StepResult]:
    assert [r.status for r in results] == ["released"] * len(results), [
        (r.status, r.error_code, r.error_message, r.reasons) for r in results
    ]
    return results


def test_tables_equal_crosstab_and_groupby(fidelity: Fidelity) -> None:
    frame = fidelity.frame
    # One researcher each: the query-set audit rightly refuses a mean of the present incomes
    # per region after the region's full count (their difference isolates the few missing ones).
    (freq,) = _released(fidelity.run([FrequencyTable(rows=["region"], cols=["sex"])]))
    # The sum apart too: beside a mean of the same cells it gives their present count, hence
    # the few missing incomes (a mean's query set is the whole cell, a sum's its present records).
    mag, spread = _released(
        fidelity.run(
            [MagnitudeTable(value="income", agg=agg, rows=["region"]) for agg in ("mean", "std")]
        )
    )
    (total,) = _released(fidelity.run([MagnitudeTable(value="income", agg="sum", rows=["region"])]))

    (hist,) = _released(
        fidelity.run([Histogram(variable="age", edges=[16, 30, 45, 60, 75, 95], by=["sex"])])
    )
    crosstab = pd.crosstab(frame["region"], frame["sex"])
    assert freq.output is not None and freq.output["values"] == crosstab.to_numpy().tolist()
    assert freq.frame().equals(
        crosstab.rename_axis(index="region", columns=None).astype("Int64")
    ) or np.array_equal(freq.frame().to_numpy(dtype=float), crosstab.to_numpy(dtype=float))
    # pandas' mean skips the missing incomes; the exact zeros count.
    means = frame.groupby("region", observed=False)["income"].mean()
    assert mag.output is not None
    assert [v for (v,) in mag.output["values"]] == pytest.approx(means.tolist(), rel=1e-12)
    grouped = frame.groupby("region", observed=False)["income"]
    assert total.output is not None and spread.output is not None
    assert [v for (v,) in total.output["values"]] == pytest.approx(
        grouped.sum().tolist(), rel=1e-12
    )
    assert [v for (v,) in spread.output["values"]] == pytest.approx(
        grouped.std(ddof=1).tolist(), rel=1e-12
    )
    assert hist.output is not None
    for row, sex in zip(hist.output["values"], ["F", "M"], strict=True):
        counts, _ = np.histogram(frame.loc[frame["sex"] == sex, "age"], [16, 30, 45, 60, 75, 95])
        assert row == counts.tolist()


def test_summary_equals_pandas_describe(fidelity: Fidelity) -> None:
    frame = fidelity.frame
    (result,) = _released(
        fidelity.run(
            [
                Summary(
                    variables=["income", "age"],
                    statistics=["count", "mean", "sd", "var"],
                    by=["sex"],
                )
            ],
        )
    )
    shown = result.frame()
    for _, row in shown.iterrows():
        values = frame.loc[frame["sex"] == row["sex"], row["variable"]]
        assert row["n"] == values.count()  # the present values
        assert row["count"] == values.count()
        assert row["mean"] == pytest.approx(values.mean(), rel=1e-12)
        assert row["sd"] == pytest.approx(values.std(ddof=1), rel=1e-12)
        assert row["var"] == pytest.approx(values.var(ddof=1), rel=1e-12)


def _windowed(values: pd.Series, position: float) -> float:
    """docs/analyses.md: the mean of the 10 order statistics nearest the Hyndman-Fan position
    (1-based; ties of the rounding go up), slid inside 1..n at the ends."""
    ordered = np.sort(values.dropna().to_numpy())
    start = math.floor(position - 4.5 + 0.5)
    start = min(max(start, 1), len(ordered) - 9)
    return float(ordered[start - 1 : start + 9].mean())


def test_windowed_quantiles_follow_their_documented_definition(fidelity: Fidelity) -> None:
    frame = fidelity.frame
    probs = [0.1, 0.25, 0.5, 0.75]
    r7, r6 = _released(
        fidelity.run(
            [
                Summary(
                    variables=["income"],
                    statistics=["quantiles", "median"],
                    quantiles=probs,
                    by=["sex"],
                ),
                Summary(
                    variables=["income"],
                    statistics=["quantiles"],
                    quantiles=probs,
                    quantile_type=6,
                    by=["sex"],
                ),
            ]
        )
    )
    for result, position in (
        (r7, lambda n, p: (n - 1) * p + 1),  # type 7 (R's default): h = (n - 1) p + 1
        (r6, lambda n, p: (n + 1) * p),  # type 6 (SPSS): h = (n + 1) p
    ):
        for _, row in result.frame().iterrows():
            values = frame.loc[frame["sex"] == row["sex"], "income"]
            n = values.count()
            for p in probs:
                expected = _windowed(values, min(max(position(n, p), 1), n))
                assert row[f"q{p!r}"] == pytest.approx(expected, rel=1e-12)
            if "median" in row:
                assert row["median"] == pytest.approx(_windowed(values, (n + 1) / 2), rel=1e-12)
    # With 10 values in the window the windowed median is within the middle order statistics.
    assert r7.frame()["median"].between(30_000, 50_000).all()


def _coefficients(result: StepResult) -> pd.DataFrame:
    frame = result.frame()
    assert frame is not None
    return frame


def test_regressions_equal_statsmodels(fidelity: Fidelity) -> None:
    import statsmodels.formula.api as smf

    frame = fidelity.frame
    analyses: list[Analysis] = [
        Regression(family="ols", formula="income ~ age + C(sex)"),
        Regression(family="ols", formula="log(income) ~ age + C(sex)", where="income > 0"),
        Regression(family="logit", formula="employed ~ age + C(sex)"),
        Regression(family="probit", formula="employed ~ age"),
        Regression(family="poisson", formula="visits ~ age + C(sex)"),
    ]
    results = _released(fidelity.run(analyses))
    complete = frame.dropna(subset=["income"])
    positive = complete[complete["income"] > 0].assign(log_income=lambda d: np.log(d["income"]))
    references = [
        smf.ols("income ~ age + C(sex)", complete).fit(),
        smf.ols("log_income ~ age + C(sex)", positive).fit(),
        smf.logit("employed ~ age + C(sex)", frame).fit(disp=0),
        smf.probit("employed ~ age", frame).fit(disp=0),
        smf.poisson("visits ~ age + C(sex)", frame).fit(disp=0),
    ]
    for result, reference in zip(results, references, strict=True):
        released = _coefficients(result)
        names = [str(n) for n in reference.params.index]
        assert list(released.index) == names
        tol = 1e-9 if result.output and result.output.get("family") == "ols" else 1e-6
        assert released["estimate"].tolist() == pytest.approx(reference.params.tolist(), rel=tol)
        assert released["std_error"].tolist() == pytest.approx(reference.bse.tolist(), rel=tol)
        assert released.attrs["n"] == int(reference.nobs)


def test_correlations_equal_pandas(fidelity: Fidelity) -> None:
    frame = fidelity.frame
    pearson, spearman = _released(
        fidelity.run(
            [
                Correlation(variables=["age", "income", "visits"]),
                Correlation(variables=["age", "income", "visits"], method="spearman"),
            ],
        )
    )
    complete = frame[["age", "income", "visits"]].dropna()  # listwise, as documented
    for result, method in ((pearson, "pearson"), (spearman, "spearman")):
        assert result.output is not None
        reference = complete.corr(method=method).to_numpy()
        assert np.allclose(result.output["matrix"], reference, rtol=1e-12, atol=1e-14)


def test_tests_equal_scipy(fidelity: Fidelity) -> None:
    from scipy import stats

    frame = fidelity.frame
    chi2, welch, student = _released(
        fidelity.run(
            [
                StatTest(test="chi2_independence", rows="region", cols="employed"),
                StatTest(test="t_two_sample", variable="income", group="sex"),
                StatTest(test="t_two_sample", variable="age", group="sex", equal_var=True),
            ],
        )
    )
    table = pd.crosstab(frame["region"], frame["employed"])
    reference = stats.chi2_contingency(table.to_numpy(), correction=False)
    assert chi2.output is not None
    assert chi2.output["statistic"] == pytest.approx(reference.statistic, rel=1e-12)
    assert chi2.output["p_value"] == pytest.approx(reference.pvalue, rel=1e-9)
    assert chi2.output["df"] == reference.dof
    for result, variable, equal in ((welch, "income", False), (student, "age", True)):
        groups = [frame.loc[frame["sex"] == s, variable].dropna() for s in ("F", "M")]
        ref = stats.ttest_ind(*groups, equal_var=equal)
        assert result.output is not None
        assert abs(result.output["statistic"]) == pytest.approx(abs(ref.statistic), rel=1e-12)
        assert result.output["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)


def test_survival_equals_lifelines(fidelity: Fidelity) -> None:
    from lifelines import KaplanMeierFitter

    frame = fidelity.frame
    (result,) = _released(
        fidelity.run(
            [Survival(time="days", event="died", by=["sex"], interval=100, max_time=1000)],
        )
    )
    assert result.output is not None
    for curve in result.output["curves"]:
        rows = frame[frame["sex"] == curve["labels"][0]]
        # The documented pooling: t counts as ceil(t / 100) * 100; after 1000, censored there.
        pooled = np.ceil(rows["days"] / 100) * 100
        event = rows["died"].where(pooled <= 1000, 0)
        pooled = pooled.clip(upper=1000)
        kmf = KaplanMeierFitter().fit(pooled, event, alpha=0.05)
        steps = [s for s in curve["steps"]]
        times = [s["time"] for s in steps]
        assert times == [t for t in kmf.event_table.index if kmf.event_table.loc[t, "observed"] > 0]
        assert [s["survival"] for s in steps] == pytest.approx(
            kmf.survival_function_.loc[times, "KM_estimate"].tolist(), rel=1e-12
        )
        ci = kmf.confidence_interval_.loc[times]
        assert [s["ci_low"] for s in steps] == pytest.approx(ci.iloc[:, 0].tolist(), rel=1e-9)
        assert [s["ci_high"] for s in steps] == pytest.approx(ci.iloc[:, 1].tolist(), rel=1e-9)
        assert [s["at_risk"] for s in steps] == kmf.event_table.loc[times, "at_risk"].tolist()


def test_a_trained_tree_equals_scikit_learn_on_the_documented_split(fidelity: Fidelity) -> None:
    from sklearn.metrics import accuracy_score, balanced_accuracy_score, roc_auc_score
    from sklearn.model_selection import train_test_split
    from sklearn.tree import DecisionTreeClassifier

    frame = fidelity.frame[fidelity.frame["region"].isin(["west", "isles"])]
    (result,) = _released(
        fidelity.run(
            [
                ModelTraining(
                    family="decision_tree",
                    target="employed",
                    features=["age", "visits"],
                    params={"max_depth": 3, "min_samples_leaf": 40},
                    seed=5,
                    # A few hundred records: the release checks' attacks on the model take
                    # seconds per thousand.
                    where="region in ('west', 'isles')",
                )
            ]
        )
    )
    # docs/models.md, "What the runner does, exactly": complete records in stored order, the
    # target coded by its declared level, a stratified split with the seed, a tree with it.
    y = frame["employed"].to_numpy()
    x = frame[["age", "visits"]].to_numpy(dtype=float)
    train, test = train_test_split(np.arange(len(y)), test_size=0.3, random_state=5, stratify=y)
    tree = DecisionTreeClassifier(max_depth=3, min_samples_leaf=40, random_state=5)
    tree.fit(x[train], y[train])
    proba = tree.predict_proba(x[test])
    assert result.output is not None
    assert (result.output["n_train"], result.output["n_test"]) == (len(train), len(test))
    metrics = result.output["metrics"]
    assert metrics["accuracy"] == accuracy_score(y[test], proba.argmax(axis=1))
    assert metrics["balanced_accuracy"] == balanced_accuracy_score(y[test], proba.argmax(axis=1))
    assert metrics["roc_auc"] == pytest.approx(roc_auc_score(y[test], proba[:, 1]), rel=1e-12)
    released = result.output["model"]["trees"][0]
    assert released["threshold"][0] == pytest.approx(float(tree.tree_.threshold[0]), rel=1e-6)


def test_quantiles_nobody_asked_for_are_refused_at_reveal_not_dropped(fidelity: Fidelity) -> None:
    # The case, sealed as raw bytes (the client's models refuse it before sealing).
    body = canonical.dumps(
        {
            "kind": "summary",
            "variables": ["income"],
            "statistics": ["count", "mean", "sd"],
            "quantiles": [0.25, 0.5, 0.75],
        }
    )
    who = fidelity.free.pop()
    sealed = seal(
        [body],
        fidelity.keys[who],
        researcher=who,
        project="p1",
        dataset="survey",
        server=fidelity.server_id,
    )
    with connect(fidelity.url, fidelity.keys[who], who) as session:
        (result,) = session.run(sealed)
    assert result.status == "failed" and result.error_code == "invalid_analysis"
    assert "'quantiles'" in (result.error_message or "")
    with pytest.raises(ValueError, match="'quantiles'"):
        Summary(variables=["income"], statistics=["count"], quantiles=[0.5])
