"""Regressions, correlations and tests against hand computations and reference libraries."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from safeaccess.client.analyses import parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import CorrelationOutput, RegressionOutput
from safeaccess.rules.outputs import TestOutput as StatTestOutput
from safeaccess.sandbox.runner import execute
from safeaccess.sandbox.runner.compute._common import AnalysisError

META = DatasetMetadata.model_validate(
    {
        "name": "m",
        "columns": [
            {"name": "sex", "type": "categorical", "levels": ["F", "M"]},
            {"name": "age", "type": "continuous"},
            {"name": "y", "type": "continuous"},
            {"name": "win", "type": "integer"},
            {"name": "visits", "type": "integer"},
            {"name": "smoker", "type": "integer"},
        ],
    }
)


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(42)
    n = 120
    sex = rng.choice(["F", "M"], n)
    age = rng.uniform(20, 70, n)
    male = (sex == "M").astype(float)
    y = 2.0 + 0.3 * age + 1.5 * male + rng.normal(0, 2, n)
    eta = -3 + 0.06 * age + 0.5 * male
    win = (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(int)
    visits = rng.poisson(np.exp(0.2 + 0.01 * age))
    smoker = rng.integers(0, 2, n)
    frame = pd.DataFrame(
        {"sex": sex, "age": age, "y": y, "win": win, "visits": visits, "smoker": smoker}
    )
    frame.loc[3, "y"] = np.nan  # listwise deletion
    return frame


FRAME = _frame()


def regress(formula: str, family: str = "ols", where: str | None = None) -> RegressionOutput:
    body: dict = {"kind": "regression", "family": family, "formula": formula}
    if where:
        body["where"] = where
    out = execute(parse_analysis(body), FRAME, META)
    assert isinstance(out, RegressionOutput)
    return out


def test_ols_matches_normal_equations() -> None:
    out = regress("y ~ age + sex")
    data = FRAME.dropna(subset=["y"])
    x = np.column_stack([np.ones(len(data)), (data["sex"] == "M").astype(float), data["age"]])
    beta, *_ = np.linalg.lstsq(x, data["y"].to_numpy(), rcond=None)
    resid = data["y"].to_numpy() - x @ beta
    df_resid = len(data) - 3
    se = np.sqrt(np.diag(resid @ resid / df_resid * np.linalg.inv(x.T @ x)))
    by_term = {c.term: c for c in out.coefficients}
    assert out.n == len(data) == 119
    assert out.df_resid == df_resid
    estimates = [c.estimate for c in out.coefficients]
    assert sorted(estimates) == pytest.approx(sorted(beta))
    age = by_term["age"]
    assert age.estimate == pytest.approx(beta[2])
    assert age.std_error == pytest.approx(se[2])
    t_crit = stats.t.ppf(0.975, df_resid)
    assert age.ci_low == pytest.approx(beta[2] - t_crit * se[2])
    assert age.p_value == pytest.approx(2 * stats.t.sf(abs(beta[2] / se[2]), df_resid))
    r2 = 1 - resid @ resid / ((data["y"] - data["y"].mean()) ** 2).sum()
    assert out.fit["r2"] == pytest.approx(r2)
    qs = out.facts.query_set.to_array()  # type: ignore[union-attr]
    assert qs[3] == -1 and (qs == 0).sum() == 119


def test_logit_matches_hand_written_irls() -> None:
    out = regress("win ~ age", family="logit")
    x = np.column_stack([np.ones(len(FRAME)), FRAME["age"]])
    yv = FRAME["win"].to_numpy(dtype=float)
    beta = np.zeros(2)
    for _ in range(50):
        p = 1 / (1 + np.exp(-x @ beta))
        w = p * (1 - p)
        beta = beta + np.linalg.solve(x.T @ (x * w[:, None]), x.T @ (yv - p))
    cov = np.linalg.inv(x.T @ (x * w[:, None]))
    assert [c.estimate for c in out.coefficients] == pytest.approx(beta, rel=1e-6)
    assert [c.std_error for c in out.coefficients] == pytest.approx(np.sqrt(np.diag(cov)), rel=1e-5)
    assert out.fit["pseudo_r2"] is not None


@pytest.mark.parametrize("family", ["probit", "poisson"])
def test_probit_and_poisson_match_statsmodels_formula_api(family: str) -> None:
    import statsmodels.formula.api as smf

    outcome = "win" if family == "probit" else "visits"
    out = regress(f"{outcome} ~ age", family=family)
    reference = getattr(smf, family)(f"{outcome} ~ age", FRAME).fit(disp=0)
    assert [c.estimate for c in out.coefficients] == pytest.approx(
        reference.params.to_list(), rel=1e-5
    )
    assert out.fit["llf"] == pytest.approx(reference.llf)


def test_facts_for_a_categorical_only_saturated_model() -> None:
    out = regress("y ~ sex")
    facts = out.facts
    assert facts.categorical_only is True
    assert facts.saturated is True  # intercept + one dummy, two covariate patterns
    males = int((FRAME.dropna(subset=["y"])["sex"] == "M").sum())
    dummies = [r for r in facts.regressors if r.binary]
    assert len(dummies) == 1
    assert (dummies[0].ones, dummies[0].zeros) == (males, 119 - males)
    mixed = regress("y ~ age + sex").facts
    assert mixed.categorical_only is False and mixed.saturated is False


def test_perfect_separation_is_a_clear_error() -> None:
    frame = FRAME.copy()
    frame["win"] = (frame["age"] > 45).astype(int)
    with pytest.raises(AnalysisError) as info:
        execute(
            parse_analysis({"kind": "regression", "family": "logit", "formula": "win ~ age"}),
            frame,
            META,
        )
    assert info.value.code == "perfect_separation"


def test_collinear_regressors_are_a_clear_error() -> None:
    frame = FRAME.copy()
    frame["visits"] = frame["smoker"] * 2
    with pytest.raises(Exception) as info:
        execute(
            parse_analysis({"kind": "regression", "formula": "y ~ smoker + visits"}), frame, META
        )
    assert getattr(info.value, "code", type(info.value).__name__) in ("singular", "DesignError")


def test_no_rows_after_filter() -> None:
    with pytest.raises(AnalysisError) as info:
        regress("y ~ age", where="age > 1000")
    assert info.value.code == "no_rows"


def correlate(body: dict, frame: pd.DataFrame = FRAME) -> CorrelationOutput:
    out = execute(parse_analysis(body), frame, META)
    assert isinstance(out, CorrelationOutput)
    return out


def test_pearson_listwise_matches_pandas() -> None:
    out = correlate({"kind": "correlation", "variables": ["y", "age", "visits"]})
    expected = FRAME[["y", "age", "visits"]].dropna().corr()
    assert np.asarray(out.matrix) == pytest.approx(expected.to_numpy())
    assert out.n == 119


def test_spearman_matches_scipy_and_binary_pair_tables() -> None:
    out = correlate(
        {"kind": "correlation", "method": "spearman", "variables": ["age", "win", "smoker"]}
    )
    rho = stats.spearmanr(FRAME[["age", "win", "smoker"]]).statistic
    assert np.asarray(out.matrix) == pytest.approx(rho)
    assert out.facts.binary == ["win", "smoker"]
    table = pd.crosstab(FRAME["win"], FRAME["smoker"]).to_numpy().tolist()
    assert out.facts.pair_tables["win|smoker"] == table


def run_test(body: dict) -> StatTestOutput:
    out = execute(parse_analysis(body), FRAME, META)
    assert isinstance(out, StatTestOutput)
    return out


def test_chi2_is_pearson_without_yates() -> None:
    out = run_test({"kind": "test", "test": "chi2_independence", "rows": "sex", "cols": "smoker"})
    observed = pd.crosstab(FRAME["sex"], FRAME["smoker"]).to_numpy().astype(float)
    expected = np.outer(observed.sum(1), observed.sum(0)) / observed.sum()
    statistic = ((observed - expected) ** 2 / expected).sum()
    assert out.statistic == pytest.approx(statistic)
    assert out.df == 1
    assert out.p_value == pytest.approx(stats.chi2.sf(statistic, 1))
    assert out.facts.table == observed.astype(int).tolist()


@pytest.mark.parametrize("equal_var", [False, True])
def test_t_test_matches_scipy(equal_var: bool) -> None:
    out = run_test(
        {
            "kind": "test",
            "test": "t_two_sample",
            "variable": "y",
            "group": "sex",
            "equal_var": equal_var,
        }
    )
    data = FRAME.dropna(subset=["y"])
    f, m = data.loc[data.sex == "F", "y"], data.loc[data.sex == "M", "y"]
    reference = stats.ttest_ind(f, m, equal_var=equal_var)
    assert out.statistic == pytest.approx(reference.statistic)
    assert out.p_value == pytest.approx(reference.pvalue)
    assert out.df == pytest.approx(reference.df)
    assert out.facts.group_counts == {"F": len(f), "M": len(m)}
    assert out.details["difference"] == pytest.approx(f.mean() - m.mean())
