"""The leverage rule: hand-built facts against the rule-set limit (default 1/threshold)."""

from __future__ import annotations

import pytest

from safeaccess import rules
from safeaccess.rules.engine import check
from safeaccess.rules.outputs import (
    Coefficient,
    CorrelationFacts,
    CorrelationOutput,
    LeverageFacts,
    RegressionFacts,
    RegressionOutput,
    SummaryVariableFacts,
)
from safeaccess.rules.outputs import TestFacts as StatTestFacts
from safeaccess.rules.outputs import TestOutput as StatTestOutput
from safeaccess.rules.ruleset import DEFAULT_RULESET, RuleSetError, load_ruleset


def _regression(top: list[float], n: int = 300) -> RegressionOutput:
    coef = Coefficient(
        term="age",
        estimate=1.0,
        std_error=0.1,
        statistic=10.0,
        p_value=0.0,
        ci_low=0.8,
        ci_high=1.2,
    )
    return RegressionOutput(
        family="ols",
        formula="income ~ age",
        n=n,
        df_resid=n - 2,
        df_model=1,
        coefficients=[coef],
        facts=RegressionFacts(
            n=n,
            df_resid=n - 2,
            df_model=1,
            categorical_only=False,
            saturated=False,
            regressors=[],
            leverage=LeverageFacts(n=n, max=top[0] if top else 0.0, top=top),
            outcome=SummaryVariableFacts(n=n, n_distinct=n),  # no total: nothing to check
        ),
    )


def test_the_default_limit_is_one_over_the_threshold() -> None:
    assert DEFAULT_RULESET.leverage_limit is None
    assert DEFAULT_RULESET.leverage_limit_value == pytest.approx(0.1)
    assert DEFAULT_RULESET.with_overrides({"threshold": 4}).leverage_limit_value == 0.25


def test_a_record_fitted_exactly_is_withheld() -> None:
    d = check(_regression([1.0, 0.02, 0.01]))
    assert d.verdict == "withhold"
    assert [(f.check, f.item) for f in d.findings] == [("leverage", "model")]
    assert "1 record " in d.findings[0].message and "limit 0.1" in d.findings[0].message


def test_a_saturated_cell_of_threshold_records_is_at_the_limit_and_released() -> None:
    # 1/10 computed in floating point may land a hair above 0.1
    assert check(_regression([0.1 + 1e-15] * 10 + [0.01])).verdict == "release"
    assert check(_regression([1 / 9] * 9 + [0.01])).verdict == "withhold"


def test_the_count_over_the_limit_says_at_least_when_the_list_is_full() -> None:
    facts = LeverageFacts(n=400, max=0.5, top=[0.5] * 50)
    assert facts.count_over(0.1) == (50, True)
    d = check(_regression([0.5] * 50, n=400))
    assert "at least 50 records" in d.findings[0].message
    assert LeverageFacts(n=50, max=0.5, top=[0.5] * 50).count_over(0.1) == (50, False)


def test_the_limit_is_a_rule_set_parameter() -> None:
    out = _regression([0.3, 0.01])
    assert check(out).verdict == "withhold"
    assert check(out, DEFAULT_RULESET.with_overrides({"leverage_limit": 0.5})).verdict == "release"
    # 1.0 turns the check off: no leverage exceeds 1
    off = DEFAULT_RULESET.with_overrides({"leverage_limit": 1})
    assert off.leverage_limit == 1.0
    assert check(_regression([1.0]), off).verdict == "release"
    # a different limit is a different rule set
    assert off.content_hash() != DEFAULT_RULESET.content_hash()


@pytest.mark.parametrize("bad", ["0", "-0.1", "1.5", "yes", "'0.1'"])
def test_an_invalid_limit_is_refused_with_its_line(bad: str) -> None:
    with pytest.raises(RuleSetError) as err:
        load_ruleset(f"name: x\nthreshold: 10\nleverage_limit: {bad}\n")
    assert err.value.key == "leverage_limit" and err.value.line == 3


def test_the_default_file_names_the_parameter() -> None:
    from importlib import resources

    text = resources.files("safeaccess.rules").joinpath("rulesets/default.yaml").read_text()
    assert "\nleverage_limit: null" in text


def test_a_regression_without_leverage_facts_goes_to_review_unless_the_check_is_off() -> None:
    out = _regression([])
    no_facts = out.model_copy(update={"facts": out.facts.model_copy(update={"leverage": None})})
    assert check(no_facts).verdict == "review"
    off = DEFAULT_RULESET.with_overrides({"leverage_limit": 1.0})
    assert check(no_facts, off).verdict == "release"


def test_correlations_and_t_tests_carry_the_rule_too() -> None:
    corr = CorrelationOutput(
        method="pearson",
        variables=["age", "income"],
        matrix=[[1.0, 0.4], [0.4, 1.0]],
        n=259,
        facts=CorrelationFacts(
            n=259, binary=["age"], leverage=LeverageFacts(n=259, max=0.996, top=[0.996, 0.004])
        ),
    )
    assert [f.check for f in check(corr).findings] == ["leverage"]
    t = StatTestOutput(
        test="t_two_sample",
        statistic=1.0,
        df=60.0,
        p_value=0.3,
        n=80,
        facts=StatTestFacts(
            n=80,
            group_counts={"F": 40, "M": 40},
            leverage=LeverageFacts(n=80, max=0.025, top=[0.025] * 50),
        ),
    )
    assert check(t).verdict == "release"


def test_the_researcher_side_check_applies_it() -> None:
    # `safeaccess.rules.check` is what a researcher runs on an output inside a TRE
    decision = rules.check(_regression([0.97, 0.02]))
    assert decision.verdict == "withhold"
    assert [f.check for f in decision.findings] == ["leverage"]
