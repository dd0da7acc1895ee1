"""validate(): every problem found, each with its field and an actionable message."""

from __future__ import annotations

import pytest

from safeaccess.client.analyses import (
    Correlation,
    FrequencyTable,
    Histogram,
    MagnitudeTable,
    Regression,
    Script,
    StatTest,
    Summary,
    to_body,
)
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.validation import (
    MAX_SCRIPT_BYTES,
    AnalysisInvalid,
    Problem,
    check_grammar,
    validate,
)

META = DatasetMetadata(
    name="census",
    columns=[
        Column(name="person_id", type="identifier"),
        Column(name="age", type="integer", bounds=(0, 110)),
        Column(name="income", type="continuous", bounds=(0, 1e7)),
        Column(name="sex", type="categorical", levels=["F", "M"]),
        Column(name="region", type="categorical", levels=["north", "south", "east"]),
        Column(name="occupation", type="categorical"),
        Column(name="education", type="ordinal", levels=["primary", "secondary", "tertiary"]),
        Column(name="satisfaction", type="ordinal", scale=(1, 5)),
        Column(name="employed", type="categorical", levels=[0, 1]),
        Column(name="kids", type="integer", bounds=(0, 12)),
        Column(name="smoker", type="integer", bounds=(0, 1)),
        Column(name="balance", type="continuous", bounds=(-1e5, 1e5)),
    ],
)


def _problems(analysis: object) -> list[Problem]:
    with pytest.raises(AnalysisInvalid) as info:
        validate(analysis, META)  # type: ignore[arg-type]
    return info.value.problems


@pytest.mark.parametrize(
    "analysis",
    [
        FrequencyTable(rows=["sex"], cols=["region"], where="age >= 18 and sex = 'F'"),
        FrequencyTable(rows=["education", "kids"], where="region in ('north', 'east')"),
        MagnitudeTable(value="income", rows=["region"], agg="mean"),
        Summary(variables=["income", "age", "satisfaction"], by=["sex"]),
        Summary(variables=["occupation"], statistics=["count", "mode"]),
        Regression(formula="log(income) ~ age * C(sex) + region + I(age ** 2)"),
        Regression(family="logit", formula="employed ~ age + C(kids)"),
        Regression(family="probit", formula="smoker ~ age"),
        Regression(family="poisson", formula="kids ~ age + sex"),
        Correlation(variables=["income", "age"], method="spearman"),
        Histogram(variable="income", bins=20, by=["sex"]),
        StatTest(test="chi2_independence", rows="sex", cols="region"),
        StatTest(test="t_two_sample", variable="income", group="sex"),
        StatTest(
            test="t_two_sample",
            variable="income",
            group="region",
            where="region in ('north', 'south') and age > 17",
        ),
        Script(code="print(1)", where="employed = 1"),
    ],
)
def test_valid_analyses_pass(analysis: object) -> None:
    validate(analysis, META)  # type: ignore[arg-type]


def test_unknown_column_suggests_close_names() -> None:
    (p,) = _problems(FrequencyTable(rows=["regoin"]))
    assert p.field == "rows[0]"
    assert "unknown column 'regoin'" in p.message and "did you mean 'region'" in p.message


def test_all_problems_are_reported_together() -> None:
    problems = _problems(
        FrequencyTable(rows=["agee", "person_id"], cols=["income"], where="sexx = 'F'")
    )
    fields = [p.field for p in problems]
    assert fields == ["where", "rows[0]", "rows[1]", "cols[0]"]
    text = str(AnalysisInvalid(problems))
    assert "did you mean 'age'" in text and "identifier" in text and "continuous" in text


@pytest.mark.parametrize(
    "analysis",
    [
        FrequencyTable(rows=["person_id"]),
        Summary(variables=["age"], by=["person_id"]),
        Regression(formula="income ~ person_id"),
        Histogram(variable="age", bins=5, where="person_id > 3"),
        Correlation(variables=["person_id", "age"]),
    ],
)
def test_identifiers_are_never_allowed(analysis: object) -> None:
    problems = _problems(analysis)
    assert any("identifier" in p.message for p in problems)


@pytest.mark.parametrize(
    ("analysis", "field", "fragment"),
    [
        (Summary(variables=["sex"]), "variables[0]", "only count and mode"),
        (Summary(variables=["education"], statistics=["median"]), "variables[0]", "median"),
        (Summary(variables=["age"], by=["income"]), "by[0]", "continuous"),
        (Histogram(variable="sex", bins=3), "variable", "frequency table"),
        (Histogram(variable="satisfaction", bins=3), "variable", "ordinal"),
        (MagnitudeTable(value="region", rows=["sex"]), "value", "numeric"),
        (MagnitudeTable(value="income", rows=["income"]), "value", "already used"),
        (FrequencyTable(rows=["sex"], cols=["sex"]), "cols[0]", "already used"),
        (Correlation(variables=["income", "sex"]), "variables[1]", "numeric"),
        (StatTest(test="chi2_independence", rows="income", cols="sex"), "rows", "continuous"),
        (StatTest(test="t_two_sample", variable="income", group="age"), "group", "categorical"),
        (StatTest(test="t_two_sample", variable="income", group="region"), "group", "3 levels"),
        (StatTest(test="t_two_sample", variable="sex", group="employed"), "variable", "numeric"),
        (Regression(formula="sex ~ age"), "formula", "must be numeric"),
        (Regression(formula="income ~ log(region)"), "formula", "transforms"),
        (Regression(formula="income ~ income + age"), "formula", "also appears"),
        (Regression(formula="income ~ age +"), "formula", "expected a column"),
        (Regression(formula="income ~ foo(age)"), "formula", "unknown function 'foo'"),
        (Regression(family="logit", formula="income ~ age"), "formula", "continuous"),
        (Regression(family="logit", formula="kids ~ age"), "formula", "0/1"),
        (Regression(family="probit", formula="satisfaction ~ age"), "formula", "0/1"),
        (Regression(family="poisson", formula="balance ~ age"), "formula", "negative"),
    ],
)
def test_wrong_types_are_refused(analysis: object, field: str, fragment: str) -> None:
    problems = _problems(analysis)
    assert any(p.field == field and fragment in p.message for p in problems), problems


def test_categorical_in_regression_without_c_and_c_on_continuous_are_fine() -> None:
    validate(Regression(formula="income ~ region + C(age) + C(balance)"), META)


@pytest.mark.parametrize(
    ("where", "fragment"),
    [
        ("sex = 'X'", "'X' is not a level of 'sex'; its levels are 'F', 'M'"),
        ("region in ('north', 'west')", "'west' is not a level"),
        ("age = 'old'", "compare it with a number"),
        ("employed = 'yes'", "compare it with a number"),
        ("sex = 1", "quote the value"),
        ("age >= ", "expected a value"),
        ("not (agge > 3)", "did you mean 'age'"),
    ],
)
def test_filter_problems(where: str, fragment: str) -> None:
    problems = _problems(FrequencyTable(rows=["sex"], where=where))
    assert any(p.field == "where" and fragment in p.message for p in problems), problems


def test_filter_grammar_error_shows_the_caret() -> None:
    (p,) = _problems(Summary(variables=["age"], where="age >> 3"))
    assert "^" in p.message and "age >> 3" in p.message


def test_filter_ordering_with_non_level_value_is_fine() -> None:
    validate(FrequencyTable(rows=["sex"], where="satisfaction >= 3 and employed != 0"), META)


def test_script_size_limit() -> None:
    validate(Script(code="x = 1\n" * 1000), META)
    big = Script.model_construct(kind="script", code="é" * (MAX_SCRIPT_BYTES // 2 + 1), where=None)
    (p,) = _problems(big)
    assert p.field == "code" and str(MAX_SCRIPT_BYTES) in p.message


def test_bodies_and_dicts_are_accepted_and_schema_errors_reported() -> None:
    validate(to_body(FrequencyTable(rows=["sex"])), META)
    validate({"kind": "frequency_table", "rows": ["sex"]}, META)
    problems = _problems({"kind": "frequency_table", "rows": []})
    assert problems and problems[0].field.startswith("frequency_table.rows")
    problems = _problems(b'{"kind": "nope"}')
    assert problems


def test_duplicate_problems_are_reported_once() -> None:
    problems = _problems(Regression(formula="income ~ agee * C(sex) + agee:C(region)"))
    assert len([p for p in problems if "agee" in p.message]) == 1


def test_check_grammar_needs_no_metadata() -> None:
    check_grammar(Regression(formula="anything ~ at + all", where="whatever = 1"))
    with pytest.raises(AnalysisInvalid) as info:
        check_grammar(Regression(formula="y ~ x ~ z", where="a = = 1"))
    assert [p.field for p in info.value.problems] == ["where", "formula"]


def test_a_summary_asks_for_at_most_19_quantiles() -> None:
    from pydantic import ValidationError

    from safeaccess.client.analyses import parse_analysis

    body = {"kind": "summary", "variables": ["income"], "statistics": ["quantiles"]}
    every_5 = [round(0.05 * k, 2) for k in range(1, 20)]
    assert isinstance(parse_analysis({**body, "quantiles": every_5}), Summary)
    with pytest.raises(ValidationError, match="at most 19 quantiles"):
        parse_analysis({**body, "quantiles": [*every_5, 0.99]})
