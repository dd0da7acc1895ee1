"""A model's outcome meets the summary rules (issue 41), run on the sandbox runner's real output.

Every family's fit gives the outcome's total over its records, OLS also its sum of squares, so
filters on the outcome are bounds, the total's dominance and the spread's concentration are
checked as for a summary, a binary outcome's classes need the threshold, and a Poisson fit's
statistics carrying sum log(y!) are not released (the likelihood-ratio statistic is, and equals
statsmodels'). Expected values come from statsmodels and pandas, not from the code under test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf

from safeaccess.client.analyses import parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.checks.regression import POISSON_WITHHELD, regression_release_view
from safeaccess.rules.engine import DEFAULT_RULESET, check
from safeaccess.rules.outputs import RegressionOutput
from safeaccess.sandbox.runner import execute

META = DatasetMetadata.model_validate(
    {
        "name": "m",
        "columns": [
            {"name": "age", "type": "integer", "bounds": [18, 99]},
            {"name": "income", "type": "integer", "bounds": [0, 200000]},
            {"name": "visits", "type": "integer"},
            {"name": "win", "type": "integer", "bounds": [0, 1]},
        ],
    }
)
PADDED = "age == 97 or income between 30000 and 30150"


def _frame(n: int = 300, seed: int = 3) -> pd.DataFrame:
    r = np.random.default_rng(seed)
    income = r.integers(31_000, 79_000, n)
    income[1:17] = r.integers(30_000, 30_151, 16)
    income[0] = 81_234
    age = r.integers(18, 90, n)
    age[0] = 97
    return pd.DataFrame(
        {
            "age": age,
            "income": income,
            "visits": r.poisson(2.0, n),
            "win": (r.random(n) < 0.4).astype(int),
        }
    )


FRAME = _frame()


def _fit(formula: str, family: str = "ols", where: str | None = None) -> RegressionOutput:
    body: dict[str, object] = {"kind": "regression", "formula": formula, "family": family}
    if where is not None:
        body["where"] = where
    out = execute(parse_analysis(body), FRAME, META)
    assert isinstance(out, RegressionOutput)
    return out


def _checks(out: RegressionOutput) -> set[str]:
    return {f.check for f in check(out, DEFAULT_RULESET).findings if f.verdict == "withhold"}


@pytest.mark.parametrize(
    ("formula", "family"),
    [("income ~ 1", "poisson"), ("income ~ 1", "ols"), ("income ~ age", "poisson")],
)
def test_a_fit_of_a_padded_set_is_withheld_by_the_filters_bounds(formula: str, family: str) -> None:
    out = _fit(formula, family, PADDED)
    assert out.n == 17
    assert "bounded_reconstruction" in _checks(out)


@pytest.mark.parametrize(
    ("formula", "family"),
    [
        ("income ~ age", "ols"),
        ("income ~ 1", "poisson"),
        ("visits ~ age", "poisson"),
        ("win ~ age", "logit"),
        ("win ~ age", "probit"),
        ("win ~ age", "ols"),  # a 0/1 outcome: its classes, not reconstruction, are checked
    ],
)
def test_ordinary_fits_pass_the_outcome_rules(formula: str, family: str) -> None:
    out = _fit(formula, family, "income > 40000" if formula.startswith("income") else None)
    assert check(out, DEFAULT_RULESET).verdict == "release", check(out, DEFAULT_RULESET).findings
    data = FRAME.query("income > 40000") if formula.startswith("income") else FRAME
    outcome = formula.split("~")[0].strip()
    assert out.facts.outcome is not None and out.facts.outcome.n == len(data)
    assert out.facts.outcome.total == pytest.approx(data[outcome].sum())


def test_a_rare_binary_outcome_is_a_small_count() -> None:
    frame = FRAME.copy()
    frame["win"] = 0
    frame.loc[[5, 50, 100, 150, 200], "win"] = 1  # five events: the intercept tells the count
    body = {"kind": "regression", "formula": "win ~ age", "family": "logit"}
    out = execute(parse_analysis(body), frame, META)
    assert isinstance(out, RegressionOutput)
    assert "binary_outcome" in _checks(out)


def test_a_dominated_outcome_total_is_withheld() -> None:
    # one income of 199 000 among incomes of 100: the mean is hers (N-K dominance of a total)
    frame = FRAME.copy()
    young = frame.index[frame["age"] < 30]
    frame.loc[young, "income"] = 100
    frame.loc[young[0], "income"] = 199_000
    body = {"kind": "regression", "formula": "income ~ 1", "family": "poisson", "where": "age < 30"}
    out = execute(parse_analysis(body), frame, META)
    assert isinstance(out, RegressionOutput)
    assert "nk_dominance" in _checks(out)


def test_a_poisson_fit_releases_no_statistic_carrying_the_log_factorials() -> None:
    out = _fit("visits ~ age", "poisson")
    reference = smf.poisson("visits ~ age", FRAME).fit(disp=0)
    # the runner computes what statsmodels gives ...
    assert out.fit["llf"] == pytest.approx(reference.llf)
    assert out.fit["llr"] == pytest.approx(reference.llr)
    # ... and the release view keeps only what the rules check
    released = regression_release_view(out, DEFAULT_RULESET)
    assert not set(POISSON_WITHHELD) & set(released.fit)
    assert set(released.fit_withheld) == {"llf", "llnull", "aic", "bic", "pseudo_r2"}
    assert released.fit["llr"] == pytest.approx(reference.llr)
    assert released.fit["llr_p_value"] == pytest.approx(reference.llr_pvalue)
    assert [c.estimate for c in released.coefficients] == pytest.approx(
        reference.params.to_list(), rel=1e-6
    )
    # other families are released whole
    logit = _fit("win ~ age", "logit")
    assert regression_release_view(logit, DEFAULT_RULESET).fit == logit.fit
