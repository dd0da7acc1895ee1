"""Regressions, correlations, test statistics, survival tables and scripts."""

from __future__ import annotations

from collections.abc import Sequence

from safeaccess.rules.engine import check
from safeaccess.rules.outputs import (
    Coefficient,
    CorrelationFacts,
    CorrelationOutput,
    LeverageFacts,
    RegressionFacts,
    RegressionOutput,
    RegressorFacts,
    ScriptFacts,
    ScriptOutput,
    SummaryVariableFacts,
    SurvivalCurve,
    SurvivalCurveFacts,
    SurvivalFacts,
    SurvivalOutput,
    SurvivalStep,
    SurvivalStepFacts,
)
from safeaccess.rules.outputs import (
    TestFacts as StatTestFacts,
)
from safeaccess.rules.outputs import (
    TestOutput as StatTestOutput,
)


def _regression(
    n: int, k: int, *, saturated: bool = False, categorical: bool = False, ones: int = 40
) -> RegressionOutput:
    coef = Coefficient(
        term="x", estimate=1.0, std_error=0.1, statistic=10.0, p_value=0.0, ci_low=0.8, ci_high=1.2
    )
    return RegressionOutput(
        family="ols",
        formula="y ~ x + C(d)",
        n=n,
        df_resid=n - k,
        df_model=k - 1,
        coefficients=[coef],
        facts=RegressionFacts(
            n=n,
            df_resid=n - k,
            df_model=k - 1,
            categorical_only=categorical,
            saturated=saturated,
            regressors=[
                RegressorFacts(term="x", binary=False),
                RegressorFacts(term="C(d)[T.1]", binary=True, ones=ones, zeros=n - ones),
            ],
            leverage=LeverageFacts(n=n, max=0.05, top=[0.05]),
            outcome=SummaryVariableFacts(n=n, n_distinct=n),  # no total: nothing to check
        ),
    )


def test_regression_residual_degrees_of_freedom() -> None:
    # 12 records, 3 parameters: 9 residual df < 10; 13 records: 10 df
    d = check(_regression(12, 3, ones=6))
    assert "dof" in {f.check for f in d.findings}
    assert check(_regression(100, 3)).verdict == "release"


def test_saturated_categorical_model_is_a_table_in_disguise() -> None:
    d = check(_regression(100, 4, saturated=True, categorical=True))
    assert [f.check for f in d.findings] == ["saturated_model"]
    # saturated but with a continuous regressor is an ordinary model
    assert check(_regression(100, 4, saturated=True, categorical=False)).verdict == "release"


def test_binary_regressor_with_few_ones() -> None:
    d = check(_regression(100, 3, ones=4))
    assert [(f.check, f.item) for f in d.findings] == [("binary_regressor", "C(d)[T.1]")]
    assert "only 4 records" in d.findings[0].message


def test_a_model_without_leverage_facts_goes_to_review() -> None:
    out = _regression(100, 3)
    bare = out.model_copy(update={"facts": out.facts.model_copy(update={"leverage": None})})
    d = check(bare)
    assert d.verdict == "review"
    assert [(f.check, f.verdict) for f in d.findings] == [("leverage", "review")]


def _corr(
    matrix: Sequence[Sequence[float]], n: int, pairs: dict[str, list[list[int]]]
) -> CorrelationOutput:
    return CorrelationOutput(
        method="pearson",
        variables=["a", "b", "c"],
        matrix=[list(r) for r in matrix],
        n=n,
        facts=CorrelationFacts(
            n=n, binary=["b", "c"], pair_tables=pairs, leverage=LeverageFacts(n=n, max=0.05)
        ),
    )


def test_correlations() -> None:
    m = [[1.0, 0.3, 0.1], [0.3, 1.0, -0.2], [0.1, -0.2, 1.0]]
    assert check(_corr(m, 200, {"b|c": [[50, 40], [60, 50]]})).verdict == "release"
    # rho = -1 between a and c: one reveals the other
    perfect = [[1.0, 0.3, -1.0], [0.3, 1.0, -0.2], [-1.0, -0.2, 1.0]]
    d = check(_corr(perfect, 200, {}))
    assert [(f.check, f.item) for f in d.findings] == [("perfect_correlation", "a and c")]
    # 11 records: 9 df
    assert {f.check for f in check(_corr(m, 11, {})).findings} == {"dof"}
    # binary-by-binary: the implied 2x2 table has a cell of 3
    d = check(_corr(m, 200, {"b|c": [[3, 47], [90, 60]]}))
    assert [(f.check, f.item) for f in d.findings] == [("threshold", "table b by c cell (1, 1)")]


def test_statistical_tests() -> None:
    t = StatTestOutput(
        test="t_two_sample",
        statistic=2.1,
        df=8.0,
        p_value=0.07,
        n=10,
        facts=StatTestFacts(n=10, group_counts={"F": 5, "M": 5}),
    )
    assert {f.check for f in check(t).findings} == {"threshold", "dof"}
    chi = StatTestOutput(
        test="chi2_independence",
        statistic=12.0,
        df=1.0,  # a 2x2 test has 1 df; its table is checked instead
        p_value=0.001,
        n=120,
        facts=StatTestFacts(n=120, table=[[40, 0], [30, 50]]),
    )
    d = check(chi)
    assert [(f.check, f.item) for f in d.findings] == [("zeros", "contingency table cell (1, 2)")]


def _survival(steps: list[tuple[float, int, int]]) -> SurvivalOutput:
    return SurvivalOutput(
        time="months",
        event="died",
        curves=[
            SurvivalCurve(
                labels=[],
                steps=[
                    SurvivalStep(time=t, at_risk=r, events=e, survival=0.5) for t, r, e in steps
                ],
            )
        ],
        facts=SurvivalFacts(
            curves=[
                SurvivalCurveFacts(
                    labels=[],
                    steps=[SurvivalStepFacts(time=t, at_risk=r, events=e) for t, r, e in steps],
                )
            ],
            n_total=steps[0][1],
        ),
    )


def test_survival_steps_need_ten_events_and_ten_at_risk() -> None:
    # pooled yearly steps: 100 at risk, 12 events; then 80 at risk, 10 events: safe
    assert check(_survival([(12, 100, 12), (24, 80, 10)])).verdict == "release"
    # a step with one event reveals when one person died; 8 at risk is a small group
    d = check(_survival([(3, 100, 1), (30, 8, 0)]))
    assert {(f.check, f.item) for f in d.findings} == {
        ("survival_events", "time 3"),
        ("survival_at_risk", "time 30"),
    }


def test_script_always_reviewed() -> None:
    d = check(ScriptOutput(stdout="hi", facts=ScriptFacts(stdout_bytes=2)))
    assert d.verdict == "review" and d.findings[0].check == "script"
