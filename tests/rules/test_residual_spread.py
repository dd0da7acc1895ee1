"""The spread concentration rule on an OLS fit's residuals."""

from __future__ import annotations

import numpy as np

from safeaccess.rules.engine import DEFAULT_RULESET, check
from safeaccess.rules.facts import residual_spread
from safeaccess.rules.outputs import (
    Coefficient,
    RegressionFacts,
    RegressionOutput,
    SpreadFacts,
)


def _ols(spread: SpreadFacts | None, n: int = 40) -> RegressionOutput:
    coef = Coefficient(
        term="Intercept",
        estimate=1.0,
        std_error=0.1,
        statistic=10.0,
        p_value=0.0,
        ci_low=0.8,
        ci_high=1.2,
    )
    return RegressionOutput(
        family="ols",
        formula="income ~ 1",
        n=n,
        df_resid=n - 1,
        df_model=0,
        coefficients=[coef],
        facts=RegressionFacts(
            n=n,
            df_resid=n - 1,
            df_model=0,
            categorical_only=False,
            saturated=False,
            regressors=[],
            residual_spread=spread,
        ),
    )


def _checks(out: RegressionOutput) -> set[str]:
    return {f.check for f in check(out, DEFAULT_RULESET).findings}


def test_residual_spread_by_hand() -> None:
    facts = residual_spread([1.0, -1.0, 3.0, 0.0])
    assert facts.top == [9.0, 1.0, 1.0] and facts.total == 11.0


def test_one_record_holding_the_residual_sum_of_squares_is_withheld() -> None:
    # 39 residuals of 1 and one of 40: the two largest hold (1600 + 1) / 1639 = 97.7 %
    residuals = np.array([1.0] * 39 + [40.0])
    assert "spread_dominance" in _checks(_ols(residual_spread(residuals)))


def test_an_even_fit_is_released() -> None:
    residuals = np.random.default_rng(3).normal(0.0, 1.0, 200)
    out = _ols(residual_spread(residuals), n=200)
    assert "spread_dominance" not in _checks(out)
