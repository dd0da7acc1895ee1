"""Filter grammar: parsing, rendering, errors that point at the token, adversarial input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from safeaccess.client.grammar import (
    MAX_DEPTH,
    MAX_LENGTH,
    And,
    Between,
    Compare,
    Filter,
    GrammarError,
    In,
    IsNull,
    Not,
    Or,
    Scalar,
    columns_of,
    parse_filter,
    render_filter,
)
from safeaccess.client.grammar.filters import KEYWORDS


def test_precedence_not_and_or() -> None:
    ast = parse_filter("not a = 1 and b = 2 or c = 3")
    assert ast == Or(
        (
            And((Not(Compare("a", "==", 1)), Compare("b", "==", 2))),
            Compare("c", "==", 3),
        )
    )


def test_parentheses_group_and_stay_nested() -> None:
    assert parse_filter("(a = 1 and b = 2) and c = 3") == And(
        (And((Compare("a", "==", 1), Compare("b", "==", 2))), Compare("c", "==", 3))
    )
    assert parse_filter("a = 1 and (b = 2 or c = 3)") == And(
        (Compare("a", "==", 1), Or((Compare("b", "==", 2), Compare("c", "==", 3))))
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("age >= 18", Compare("age", ">=", 18)),
        ("18 <= age", Compare("age", ">=", 18)),
        ("-2.5 > x", Compare("x", "<", -2.5)),
        ("age = 1e3", Compare("age", "==", 1000.0)),
        ("age <> 3", Compare("age", "!=", 3)),
        ("name = 'O''Brien'", Compare("name", "==", "O'Brien")),
        ('name = "say ""hi"""', Compare("name", "==", 'say "hi"')),
        ("flag = TRUE", Compare("flag", "==", True)),
        ("flag != false", Compare("flag", "!=", False)),
        ("r IN (1, 2, -3)", In("r", (1, 2, -3))),
        ("r not in ('a')", In("r", ("a",), negated=True)),
        ("x between 1 and 2.5", Between("x", 1, 2.5)),
        ("x NOT BETWEEN 'a' and 'c'", Between("x", "a", "c", negated=True)),
        ("x is null", IsNull("x")),
        ("x Is Not Null", IsNull("x", negated=True)),
        ("not not x is null", Not(Not(IsNull("x")))),
    ],
)
def test_parses(text: str, expected: Filter) -> None:
    ast = parse_filter(text)
    assert ast == expected
    assert type(getattr(ast, "value", None)) is type(getattr(expected, "value", None))


def test_columns_of() -> None:
    ast = parse_filter("age > 1 and (sex = 'M' or not region in (1, 2)) and income is null")
    assert columns_of(ast) == {"age", "sex", "region", "income"}


@pytest.mark.parametrize(
    ("text", "token", "fragment"),
    [
        ("age >= ", "", "expected a value"),
        ("age >> 3", ">", "expected a value"),
        ("age = null", "null", "is null"),
        ("age == 1 age == 2", "age", "join conditions"),
        ("and = 1", "and", "reserved word"),
        ("a in (1, 'x')", "(", "mixes"),
        ("a between 1 and 'z'", "between", "same kind"),
        ("a between 1 or 2", "or", "expected 'and'"),
        ("a is 3", "3", "expected 'null'"),
        ("a not = 3", "=", "expected 'in' or 'between'"),
        ("a = 'open", "'open", "unterminated"),
        ("a = 12abc", "12abc", "malformed number"),
        ("a = 1e999", "1e999", "out of range"),
        ("a = 1; drop", ";", "unexpected character"),
        ("(a = 1", "", "to close"),
        ("()", ")", "empty parentheses"),
        ("a", "", "expected a comparison"),
        ("", "", "empty"),
        ("__import__('os') = 1", "__import__", "unknown function '__import__'"),
    ],
)
def test_errors_point_at_the_token(text: str, token: str, fragment: str) -> None:
    with pytest.raises(GrammarError, match=fragment) as info:
        parse_filter(text)
    err = info.value
    assert err.token == token
    assert text[err.position : err.position + len(token)] == token
    if token and text:
        # the caret line sits under the token
        lines = str(err).splitlines()
        assert lines[1].strip() == text.strip()
        assert lines[2].index("^") - lines[1].index(text.strip()[0]) == err.position


def test_length_and_depth_limits() -> None:
    with pytest.raises(GrammarError, match="limit"):
        parse_filter("a = 1 and " * (MAX_LENGTH // 10) + "a = 1")
    with pytest.raises(GrammarError, match="nested"):
        parse_filter("(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1))
    with pytest.raises(GrammarError, match="nested"):
        parse_filter("not " * (MAX_DEPTH + 1) + "a = 1")
    # just inside the limit parses
    ok = parse_filter("(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH)
    assert ok == Compare("a", "==", 1)
    # a long flat chain within the length limit is fine and renders without recursion trouble
    chain = " and ".join(f"a{i} = {i}" for i in range(600))
    assert len(render_filter(parse_filter(chain))) == len(chain.replace(" = ", " == "))


def test_non_string_input() -> None:
    with pytest.raises(GrammarError):
        parse_filter(123)  # type: ignore[arg-type]


def test_ast_invariants() -> None:
    with pytest.raises(ValueError):
        And((Compare("a", "==", 1),))
    with pytest.raises(ValueError):
        In("a", ())


# ------------------------------------------------------------------------------------ properties

_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True).filter(
    lambda s: s.lower() not in KEYWORDS
)
_numbers = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=False, allow_infinity=False),
)
_strings = st.text(max_size=8)
_ops = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])


def _homogeneous(elements: st.SearchStrategy[Scalar]) -> st.SearchStrategy[tuple[Scalar, ...]]:
    return st.lists(elements, min_size=1, max_size=4).map(tuple)


_leaves = st.one_of(
    st.builds(Compare, _names, _ops, st.one_of(_numbers, _strings, st.booleans())),
    st.builds(
        In,
        _names,
        st.one_of(_homogeneous(_numbers), _homogeneous(_strings), _homogeneous(st.booleans())),
        st.booleans(),
    ),
    st.one_of(
        st.builds(Between, _names, _numbers, _numbers, st.booleans()),
        st.builds(Between, _names, _strings, _strings, st.booleans()),
    ),
    st.builds(IsNull, _names, st.booleans()),
)
filters = st.recursive(
    _leaves,
    lambda sub: st.one_of(
        st.builds(Not, sub),
        st.builds(And, st.lists(sub, min_size=2, max_size=4).map(tuple)),
        st.builds(Or, st.lists(sub, min_size=2, max_size=4).map(tuple)),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(filters)
def test_parse_render_roundtrip(ast: Filter) -> None:
    text = render_filter(ast)
    again = parse_filter(text)
    assert again == ast
    assert render_filter(again) == text


_FILTER_ALPHABET = st.sampled_from(
    [
        "a",
        "b1",
        " ",
        "and",
        "or",
        "not",
        "in",
        "between",
        "is",
        "null",
        "true",
        "(",
        ")",
        ",",
        "=",
        "==",
        "!=",
        "<",
        ">=",
        "-",
        "1",
        "2.5",
        "1e",
        "'x'",
        "'",
        '"',
        "~",
        "*",
        ".",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=40), st.lists(_FILTER_ALPHABET, max_size=25).map(" ".join)))
def test_random_text_only_raises_grammar_error(text: str) -> None:
    try:
        ast = parse_filter(text)
    except GrammarError:
        return
    # whatever parses must render and parse back to the same tree
    assert parse_filter(render_filter(ast)) == ast
