"""The runner's leverage facts for every model kind, and what the rules make of them.

Expected hat values come from outside the code under test: closed forms (a lone record in a
saturated position has leverage 1, a group of n has 1/n), the explicit X(X'X)^-1X' with a matrix
inverse, and statsmodels' GLM influence (its own IRLS) for logit, probit and Poisson.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from safeaccess.client.analyses import parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.engine import check
from safeaccess.rules.outputs import CorrelationOutput, Output, RegressionOutput
from safeaccess.rules.outputs import TestOutput as StatTestOutput
from safeaccess.rules.ruleset import DEFAULT_RULESET
from safeaccess.sandbox.runner import execute

META = DatasetMetadata.model_validate(
    {
        "name": "m",
        "columns": [
            {"name": "grp", "type": "categorical", "levels": ["A", "B"]},
            {"name": "x", "type": "continuous"},
            {"name": "age", "type": "integer"},
            {"name": "y", "type": "continuous"},
            {"name": "win", "type": "integer"},
            {"name": "visits", "type": "integer"},
        ],
    }
)


def _frame(ages: list[int], seed: int = 3) -> pd.DataFrame:
    """Records with the given ages (a few-valued numeric regressor) and continuous x."""
    rng = np.random.default_rng(seed)
    n = len(ages)
    age = np.asarray(ages, dtype=np.int64)
    x = rng.normal(50.0, 10.0, n)
    grp = np.where(np.arange(n) % 2 == 0, "A", "B")
    y = 1000.0 + 20.0 * age + 5.0 * x + rng.normal(0.0, 50.0, n)
    eta = -2.0 + 0.03 * (x - 50.0) + 0.02 * (age - age.mean())
    win = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-eta))).astype(np.int64)
    visits = rng.poisson(np.exp(0.5 + 0.01 * (x - 50.0)))
    return pd.DataFrame({"grp": grp, "x": x, "age": age, "y": y, "win": win, "visits": visits})


def _run(frame: pd.DataFrame, body: dict[str, Any]) -> Output:
    return execute(parse_analysis(body), frame, META)


def _regress(frame: pd.DataFrame, formula: str, family: str = "ols") -> RegressionOutput:
    out = _run(frame, {"kind": "regression", "family": family, "formula": formula})
    assert isinstance(out, RegressionOutput)
    return out


def _hats(x: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """diag(W^1/2 X (X'WX)^-1 X' W^1/2) by explicit inversion."""
    w = np.ones(x.shape[0]) if w is None else w
    xtwx_inv = np.linalg.inv(x.T @ (x * w[:, None]))
    return np.einsum("ij,jk,ik->i", x, xtwx_inv, x) * w


def _checks(out: Output) -> set[str]:
    return {f.check for f in check(out).findings}


# ------------------------------------------------------------------------ numeric regressors


def test_a_two_valued_numeric_regressor_with_a_lone_record_has_leverage_one() -> None:
    frame = _frame([90] * 60 + [97])
    out = _regress(frame, "y ~ age")
    lev = out.facts.leverage
    assert lev is not None and lev.n == 61
    assert lev.max == pytest.approx(1.0, abs=1e-9)
    # the other 60 share 1/60 each: the top list is the lone record, then 1/60
    assert lev.top[1] == pytest.approx(1.0 / 60, rel=1e-9)
    # the binary-regressor and saturated-model checks do not see it; leverage does
    assert _checks(out) == {"leverage"}
    assert check(out).verdict == "withhold"


def test_few_valued_regressor_withheld_while_every_value_has_threshold_records() -> None:
    # ages 30/40 with 10 and 40 records: the saturated leverage of the small group is 1/10,
    # exactly the default limit, so it is released; with 9 it is withheld
    ok = _regress(_frame([30] * 10 + [40] * 40), "y ~ age")
    assert ok.facts.leverage is not None
    assert ok.facts.leverage.max == pytest.approx(0.1, rel=1e-9)
    assert check(ok).verdict == "release"
    small = _regress(_frame([30] * 9 + [40] * 40), "y ~ age")
    assert small.facts.leverage is not None
    assert small.facts.leverage.max == pytest.approx(1 / 9, rel=1e-9)
    assert _checks(small) == {"leverage"}


def test_a_quadratic_on_three_values_fits_both_lone_records() -> None:
    frame = _frame([40] * 50 + [70, 75])
    out = _regress(frame, "y ~ age + I(age ** 2)")
    lev = out.facts.leverage
    assert lev is not None
    assert lev.top[:2] == pytest.approx([1.0, 1.0], abs=1e-8)
    assert lev.count_over(DEFAULT_RULESET.leverage_limit_value) == (2, False)
    finding = next(f for f in check(out).findings if f.check == "leverage")
    assert "2 records" in finding.message


def test_a_cubic_on_four_values_fits_its_lone_record() -> None:
    frame = _frame([30] * 20 + [40] * 20 + [50] * 20 + [90])
    out = _regress(frame, "y ~ age + I(age ** 2) + I(age ** 3)")
    assert out.facts.leverage is not None
    assert out.facts.leverage.max == pytest.approx(1.0, abs=1e-8)
    assert "leverage" in _checks(out)


def test_an_interaction_that_isolates_a_record_fits_it() -> None:
    # group B has one record at age 60: age:grp gives B its own slope through that record
    ages = [40] * 40 + [60] * 20 + [40] * 20 + [60]
    frame = _frame(ages)
    frame["grp"] = ["A"] * 60 + ["B"] * 21
    out = _regress(frame, "y ~ age * grp")
    x = np.column_stack(
        [
            np.ones(len(frame)),
            (frame.grp == "B").to_numpy(float),
            frame.age.to_numpy(float),
            frame.age.to_numpy(float) * (frame.grp == "B").to_numpy(float),
        ]
    )
    assert out.facts.leverage is not None
    assert out.facts.leverage.max == pytest.approx(_hats(x).max(), rel=1e-9)
    assert out.facts.leverage.max == pytest.approx(1.0, abs=1e-9)
    assert "leverage" in _checks(out)


def test_ols_hat_values_match_the_explicit_hat_matrix() -> None:
    frame = _frame(list(np.random.default_rng(1).integers(20, 80, 200)))
    out = _regress(frame, "y ~ x + age + grp")
    x = np.column_stack(
        [
            np.ones(len(frame)),
            (frame.grp == "B").to_numpy(float),
            frame.x.to_numpy(float),
            frame.age.to_numpy(float),
        ]
    )
    expected = np.sort(_hats(x))[::-1]
    assert out.facts.leverage is not None
    assert out.facts.leverage.top == pytest.approx(expected[:50].tolist(), rel=1e-8)


def test_benign_regressions_on_continuous_data_are_released() -> None:
    # (a quadratic in a normal regressor gives a record 3 SD out about (1 + 9 + 32)/n, so a
    # few hundred records are not enough for it; a thousand are)
    frame = _frame(list(np.random.default_rng(2).integers(20, 80, 1000)))
    for formula, family in (
        ("y ~ x + age", "ols"),
        ("y ~ x + I(x ** 2) + grp", "ols"),
        ("win ~ x + age", "logit"),
        ("win ~ x", "probit"),
        ("visits ~ x + age", "poisson"),
    ):
        out = _regress(frame, formula, family)
        assert out.facts.leverage is not None
        assert out.facts.leverage.max < 0.1, formula
        assert check(out).verdict == "release", (formula, check(out).findings)


# ------------------------------------------------------------------------------------- GLMs


@pytest.mark.parametrize(
    ("family", "formula"),
    [("logit", "win ~ x + age"), ("probit", "win ~ x + age"), ("poisson", "visits ~ x + age")],
)
def test_glm_leverage_is_taken_at_the_fitted_weights(family: str, formula: str) -> None:
    import statsmodels.api as sm

    frame = _frame(list(np.random.default_rng(4).integers(20, 80, 150)))
    out = _regress(frame, formula, family)
    x = sm.add_constant(frame[["x", "age"]].to_numpy(float))
    y = frame[formula.split(" ~ ")[0]].to_numpy(float)
    glm_family = {
        "logit": sm.families.Binomial(),
        "probit": sm.families.Binomial(link=sm.families.links.Probit()),
        "poisson": sm.families.Poisson(),
    }[family]
    fitted = sm.GLM(y, x, family=glm_family).fit(tol=1e-12)
    # at the expected (Fisher) information: the IRLS weights
    expected = np.sort(fitted.get_hat_matrix_diag(observed=False))[::-1]
    assert out.facts.leverage is not None
    assert out.facts.leverage.top == pytest.approx(expected[:50].tolist(), rel=1e-5)


@pytest.mark.parametrize("family", ["logit", "probit", "poisson"])
def test_a_glm_on_a_regressor_with_a_small_group_fits_that_group(family: str) -> None:
    # three records at age 97 (with both outcomes, so the estimates exist): whatever the
    # weights, a saturated two-group design gives each of the three the leverage 1/3
    frame = _frame([50] * 80 + [97] * 3, seed=5)
    frame.loc[frame.index[-3:], "win"] = [1, 0, 1]
    frame.loc[frame.index[-3:], "visits"] = [2, 0, 5]
    response = "visits" if family == "poisson" else "win"
    out = _regress(frame, f"{response} ~ age", family)
    assert out.facts.leverage is not None
    assert out.facts.leverage.top[:3] == pytest.approx([1 / 3] * 3, rel=1e-6)
    assert _checks(out) == {"leverage"}


# ---------------------------------------------------------------------- correlations, tests


def test_a_correlation_is_checked_as_the_regressions_it_contains() -> None:
    frame = _frame([90] * 60 + [97])
    out = _run(frame, {"kind": "correlation", "variables": ["age", "y"]})
    assert isinstance(out, CorrelationOutput)
    assert out.facts.leverage is not None
    # y on age: the lone age-97 record has leverage 1/n + (97 - mean)^2 / Sxx = 1
    assert out.facts.leverage.max == pytest.approx(1.0, abs=1e-9)
    assert _checks(out) == {"leverage"}


def test_correlation_leverage_takes_each_pair_both_ways() -> None:
    frame = _frame(list(np.random.default_rng(6).integers(20, 80, 100)))
    frame.loc[0, "x"] = 500.0  # an outlier in x: x as the regressor of y on x
    out = _run(frame, {"kind": "correlation", "variables": ["y", "x"]})
    assert isinstance(out, CorrelationOutput)
    xs = frame.x.to_numpy(float)
    expected = 1 / len(xs) + (xs[0] - xs.mean()) ** 2 / ((xs - xs.mean()) ** 2).sum()
    assert out.facts.leverage is not None
    assert out.facts.leverage.max == pytest.approx(expected, rel=1e-9)
    assert expected > 0.5
    assert "leverage" in _checks(out)


def test_a_benign_correlation_is_released() -> None:
    frame = _frame(list(np.random.default_rng(7).integers(20, 80, 300)))
    for method in ("pearson", "spearman"):
        out = _run(frame, {"kind": "correlation", "variables": ["x", "y", "age"], "method": method})
        assert check(out).verdict == "release", check(out).findings


def test_a_two_sample_t_test_is_the_regression_on_its_group_indicator() -> None:
    frame = _frame(list(np.random.default_rng(8).integers(20, 80, 40)))
    frame["grp"] = ["A"] * 31 + ["B"] * 9
    out = _run(frame, {"kind": "test", "test": "t_two_sample", "variable": "y", "group": "grp"})
    assert isinstance(out, StatTestOutput)
    assert out.facts.leverage is not None
    assert out.facts.leverage.max == pytest.approx(1 / 9, rel=1e-12)
    assert "leverage" in _checks(out)


def test_hat_values_that_cannot_be_computed_count_as_exact_fits() -> None:
    from safeaccess.sandbox.runner.compute.leverage import hat_values

    x = np.column_stack([np.ones(4), np.arange(4.0)])
    h = hat_values(x, np.array([1.0, 1.0, 1.0, np.inf]))
    assert np.all((h >= 0.0) & (h <= 1.0))
    assert h.max() == 1.0
    # and with finite weights they are the weighted hat values
    w = np.array([1.0, 2.0, 3.0, 4.0])
    assert hat_values(x, w) == pytest.approx(_hats(x, w), rel=1e-12)
