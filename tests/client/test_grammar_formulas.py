"""Formula grammar: term expansion (checked against patsy's parser), errors, round trips."""

from __future__ import annotations

import patsy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from safeaccess.client.grammar import (
    MAX_DEPTH,
    TRANSFORMS,
    Call,
    Categorical,
    Formula,
    GrammarError,
    Power,
    Var,
    columns_of,
    parse_formula,
    render_formula,
)
from safeaccess.client.grammar.formulas import MAX_POWER, MIN_POWER


def _patsy_terms(text: str) -> tuple[list[frozenset[str]], bool]:
    """Terms and intercept as patsy's formula parser sees them (the parser evaluates nothing)."""
    desc = patsy.ModelDesc.from_formula(text)
    terms = [frozenset(f.name() for f in t.factors) for t in desc.rhs_termlist]
    intercept = frozenset() in terms
    return [t for t in terms if t], intercept


def _ours(text: str) -> tuple[list[frozenset[str]], bool]:
    f = parse_formula(text)
    names = [frozenset(n.split(":")) for n in f.term_names]
    return names, f.intercept


@pytest.mark.parametrize(
    "text",
    [
        "y ~ a + b",
        "y ~ a * b",
        "y ~ a * b * c",
        "y ~ a * b - a:b",
        "y ~ (a + b):c",
        "y ~ (a + b) * (c + d)",
        "y ~ a:b + b:a",
        "y ~ a + a",
        "y ~ a * b - 1",
        "y ~ a + b + 0",
        "y ~ -1 + a",
        "y ~ 0 + a",
        "y ~ a - 1 + 1",
        "y ~ a - b",
        "y ~ C(s) * x + log(z) + I(x ** 2)",
        "y ~ 1",
        "y ~ a:b:c - a:c",
        "y ~ (a*b*c) - (a:b:c)",
    ],
)
def test_expansion_agrees_with_patsy(text: str) -> None:
    assert _ours(text) == _patsy_terms(text)


def test_structure() -> None:
    f = parse_formula("log(income) ~ age * C(sex) + I(age ** 2) + sqrt(abs(debt))")
    assert f.response == Call("log", Var("income"))
    assert f.terms == (
        (Var("age"),),
        (Categorical("sex"),),
        (Var("age"), Categorical("sex")),
        (Power(Var("age"), 2),),
        (Call("sqrt", Call("abs", Var("debt"))),),
    )
    assert f.intercept
    assert f.term_names == ["age", "C(sex)", "age:C(sex)", "I(age ** 2)", "sqrt(abs(debt))"]
    assert columns_of(f) == {"income", "age", "sex", "debt"}


def test_names_that_look_like_functions_are_columns_without_parentheses() -> None:
    f = parse_formula("log ~ C + I + exp")
    assert f.response == Var("log")
    assert f.terms == ((Var("C"),), (Var("I"),), (Var("exp"),))


@pytest.mark.parametrize(
    ("text", "token", "fragment"),
    [
        ("y", "", "expected '~'"),
        ("~ x", "~", "needs a response"),
        ("y ~", "", "nothing after"),
        ("y ~ x +", "", "expected a column"),
        ("y ~ foo(x)", "foo", "unknown function"),
        ("y ~ __import__(x)", "__import__", "unknown function"),
        ("y ~ x.y", ".", "unexpected character"),
        ("y ~ 2", "2", "cannot be a term"),
        ("y ~ 1.0", "1.0", "cannot be a term"),
        ("y ~ I(x)", ")", "only takes a power"),
        ("y ~ I(x ** 1)", "1", "exponent"),
        ("y ~ I(x ** 11)", "11", "exponent"),
        ("y ~ I(x ** 2.5)", "2.5", "exponent"),
        ("y ~ C(x, Sum)", ",", "exactly one column"),
        ("y ~ C(log(x))", "log", "one column name"),
        ("y ~ log(C(x))", "C", "cannot be the response or transformed"),
        ("C(y) ~ x", "C", "cannot be the response"),
        ("y ~ x ~ z", "~", "join terms"),
        ("y ~ (1 + x):z", ":", "interaction"),
        ("y ~ 0", "~", "no regressors"),
        ("y ~ x - 1 - x", "~", "no regressors"),
        ("y ~ -x", "-", "leading '-'"),
        ("y ~ x * (z", "", "to close"),
        ("y ~ ()", ")", "empty parentheses"),
        ("y ~ a == b", "==", "join terms"),
    ],
)
def test_errors_name_the_token(text: str, token: str, fragment: str) -> None:
    with pytest.raises(GrammarError, match=fragment) as info:
        parse_formula(text)
    assert info.value.token == token
    assert text[info.value.position : info.value.position + len(token)] == token


def test_depth_limit() -> None:
    deep = "y ~ " + "(" * (MAX_DEPTH + 1) + "x" + ")" * (MAX_DEPTH + 1)
    with pytest.raises(GrammarError, match="nested"):
        parse_formula(deep)
    calls = "y ~ " + "log(" * (MAX_DEPTH + 1) + "x" + ")" * (MAX_DEPTH + 1)
    with pytest.raises(GrammarError, match="nested"):
        parse_formula(calls)


def test_formula_invariants() -> None:
    with pytest.raises(ValueError):
        Formula(Var("y"), ((Var("a"),), (Var("a"),)))
    with pytest.raises(ValueError):
        Formula(Var("y"), ((Var("a"), Var("a")),))
    with pytest.raises(ValueError):
        Formula(Var("y"), (), intercept=False)
    with pytest.raises(ValueError):
        Power(Var("x"), MAX_POWER + 1)


# ------------------------------------------------------------------------------------ properties

_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,5}", fullmatch=True)
numerics = st.recursive(
    st.builds(Var, _names),
    lambda sub: st.one_of(
        st.builds(Call, st.sampled_from(TRANSFORMS), sub),
        st.builds(Power, sub, st.integers(MIN_POWER, MAX_POWER)),
    ),
    max_leaves=3,
)
factors = st.one_of(numerics, st.builds(Categorical, _names))
terms = st.lists(factors, min_size=1, max_size=3, unique=True).map(tuple)


@st.composite
def formulas(draw: st.DrawFn) -> Formula:
    response = draw(numerics)
    raw = draw(st.lists(terms, max_size=5, unique_by=frozenset))
    intercept = draw(st.booleans()) if raw else True
    return Formula(response, tuple(raw), intercept)


@settings(max_examples=300, deadline=None)
@given(formulas())
def test_parse_render_roundtrip(formula: Formula) -> None:
    text = render_formula(formula)
    again = parse_formula(text)
    assert again == formula
    assert render_formula(again) == text


_VARS = ["a", "b", "c", "d"]


@st.composite
def rhs_text(draw: st.DrawFn, depth: int = 0) -> str:
    if depth > 2 or draw(st.booleans()):
        return draw(st.sampled_from(_VARS))
    op = draw(st.sampled_from(["+", "-", "*", ":"]))
    left = draw(rhs_text(depth + 1))
    right = draw(rhs_text(depth + 1))
    return f"({left} {op} {right})" if draw(st.booleans()) else f"{left} {op} {right}"


@settings(max_examples=200, deadline=None)
@given(rhs_text())
def test_random_formulas_expand_like_patsy(rhs: str) -> None:
    text = f"y ~ {rhs}"
    try:
        ours = _ours(text)
    except GrammarError:
        # only refused when nothing is left (patsy then has an intercept-only model)
        assert _patsy_terms(text)[0] == []
        return
    assert ours == _patsy_terms(text)


_FORMULA_ALPHABET = st.sampled_from(
    [
        "y",
        "x",
        " ",
        "~",
        "+",
        "-",
        "*",
        ":",
        "**",
        "(",
        ")",
        ",",
        "C",
        "I",
        "log",
        "0",
        "1",
        "2",
        "2.5",
        "'s'",
        "=",
        "sqrt",
        "abs",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=40), st.lists(_FORMULA_ALPHABET, max_size=25).map("".join)))
def test_random_text_only_raises_grammar_error(text: str) -> None:
    try:
        f = parse_formula(text)
    except GrammarError:
        return
    assert parse_formula(render_formula(f)) == f
