"""row_mask: types, SQL three-valued null logic (checked against a row-by-row reference)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from safeaccess.client.grammar import (
    And,
    Between,
    Compare,
    Filter,
    In,
    IsNull,
    Not,
    Or,
    parse_filter,
    render_filter,
)
from safeaccess.sandbox.runner.filters import FilterError, row_mask


@pytest.fixture
def frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "age": [17, 18, 40, None, 65],
            "sex": ["F", "M", None, "F", "M"],
            "region": pd.Categorical(["b", "a", "b", "c", None], categories=["c", "b", "a"]),
            "employed": [True, False, True, True, False],
            "score": pd.array([1, None, 3, 4, 5], dtype="Int64"),
        },
        index=[10, 11, 12, 13, 14],  # not 0..n-1: row_mask must work by position
    )


def test_none_keeps_all_rows(frame: pd.DataFrame) -> None:
    mask = row_mask(frame, None)
    assert mask.dtype == bool and mask.tolist() == [True] * 5


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("age >= 18", [False, True, True, False, True]),
        ("18 <= age", [False, True, True, False, True]),
        ("age = 40", [False, False, True, False, False]),
        ("age <> 40", [True, True, False, False, True]),
        ("age between 18 and 40", [False, True, True, False, False]),
        ("age not between 18 and 40", [True, False, False, False, True]),
        ("sex = 'F'", [True, False, False, True, False]),
        ("sex != 'F'", [False, True, False, False, True]),
        ("sex in ('M', 'X')", [False, True, False, False, True]),
        ("sex not in ('M')", [True, False, False, True, False]),
        ("sex is null", [False, False, True, False, False]),
        ("sex is not null", [True, True, False, True, True]),
        ("employed = true", [True, False, True, True, False]),
        ("employed = 0", [False, True, False, False, True]),
        ("score > 2", [False, False, True, True, True]),
        ("score is null", [False, True, False, False, False]),
        # categorical compared by value, not by code: codes are c=0, b=1, a=2
        ("region = 'a'", [False, True, False, False, False]),
        ("region < 'b'", [False, True, False, False, False]),
        # SQL nulls: not of unknown stays unknown, so missing rows are never selected
        ("not age >= 18", [True, False, False, False, False]),
        ("not (sex = 'F')", [False, True, False, False, True]),
        ("age > 50 or sex = 'F'", [True, False, False, True, True]),
        ("not (age > 50 or sex = 'F')", [False, True, False, False, False]),
        ("age > 30 and sex is null", [False, False, True, False, False]),
    ],
)
def test_predicates(frame: pd.DataFrame, where: str, expected: list[bool]) -> None:
    assert row_mask(frame, where).tolist() == expected


def test_accepts_a_parsed_filter(frame: pd.DataFrame) -> None:
    ast = parse_filter("age >= 18 and sex = 'M'")
    assert row_mask(frame, ast).tolist() == [False, True, False, False, True]


@pytest.mark.parametrize(
    ("where", "fragment"),
    [
        ("age = 'old'", "numeric"),
        ("sex = 1", "holds text"),
        ("sex in (1, 2)", "holds text"),
        ("region between 1 and 2", "holds text"),
        ("height > 2", "'height'"),
        ("age >=", "invalid filter"),
    ],
)
def test_errors(frame: pd.DataFrame, where: str, fragment: str) -> None:
    with pytest.raises(FilterError, match=fragment):
        row_mask(frame, where)


def test_mixed_type_column_is_refused() -> None:
    mixed = pd.DataFrame({"x": [1, "a", 2.5]})
    with pytest.raises(FilterError, match="mixed"):
        row_mask(mixed, "x = 1")


def test_all_missing_column_selects_nothing_but_is_null() -> None:
    empty = pd.DataFrame({"x": [None, None]}, dtype=object)
    assert row_mask(empty, "x = 'a'").tolist() == [False, False]
    assert row_mask(empty, "not x = 1").tolist() == [False, False]
    assert row_mask(empty, "x is null").tolist() == [True, True]


# --------------------------------------------------- property: agree with a row-by-row reference

NUM = [1.0, 2.0, None, 3.0, 2.0, None, 5.0, 1.0]
TXT = ["a", None, "b", "c", "a", "b", None, "c"]
DATA = pd.DataFrame({"n": NUM, "t": TXT})


COLUMNS: dict[str, list[Any]] = {"n": NUM, "t": TXT}


def _ref_pred(node: Compare | In | Between | IsNull, row: int) -> bool | None:
    """Per-row SQL semantics written directly from the definitions (None = unknown)."""
    if isinstance(node, IsNull):
        missing = COLUMNS[node.column][row] is None
        return missing != node.negated
    value = COLUMNS[node.column][row]
    if value is None:
        return None
    if isinstance(node, Compare):
        ops = {
            "==": value == node.value,
            "!=": value != node.value,
            "<": value < node.value,
            "<=": value <= node.value,
            ">": value > node.value,
            ">=": value >= node.value,
        }
        return bool(ops[node.op])
    if isinstance(node, In):
        return (value in node.values) != node.negated
    assert isinstance(node, Between)
    return bool(node.low <= value <= node.high) != node.negated


def _ref(node: Filter, row: int) -> bool | None:
    if isinstance(node, Not):
        inner = _ref(node.operand, row)
        return None if inner is None else not inner
    if isinstance(node, And):
        vals = [_ref(o, row) for o in node.operands]
        if any(v is False for v in vals):
            return False
        return None if any(v is None for v in vals) else True
    if isinstance(node, Or):
        vals = [_ref(o, row) for o in node.operands]
        if any(v is True for v in vals):
            return True
        return None if any(v is None for v in vals) else False
    return _ref_pred(node, row)


_nums = st.sampled_from([0.5, 1.0, 2.0, 3.0, 4.0])
_txts = st.sampled_from(["a", "b", "c", "d"])
_ops = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])
_leaf = st.one_of(
    st.builds(Compare, st.just("n"), _ops, _nums),
    st.builds(Compare, st.just("t"), _ops, _txts),
    st.builds(In, st.just("n"), st.lists(_nums, min_size=1, max_size=3).map(tuple), st.booleans()),
    st.builds(In, st.just("t"), st.lists(_txts, min_size=1, max_size=3).map(tuple), st.booleans()),
    st.builds(Between, st.just("n"), _nums, _nums, st.booleans()),
    st.builds(IsNull, st.sampled_from(["n", "t"]), st.booleans()),
)
_tree = st.recursive(
    _leaf,
    lambda sub: st.one_of(
        st.builds(Not, sub),
        st.builds(And, st.lists(sub, min_size=2, max_size=3).map(tuple)),
        st.builds(Or, st.lists(sub, min_size=2, max_size=3).map(tuple)),
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(_tree)
def test_matches_row_by_row_reference(node: Filter) -> None:
    expected = [_ref(node, i) is True for i in range(len(DATA))]
    assert row_mask(DATA, node).tolist() == expected
    # the rendered text selects the same rows
    assert row_mask(DATA, render_filter(node)).tolist() == expected


def test_float_literal_compares_exactly() -> None:
    df = pd.DataFrame({"x": [0.1 + 0.2, 0.3, math.nan]})
    assert row_mask(df, "x = 0.3").tolist() == [False, True, False]
    assert np.array_equal(row_mask(df, "x > 0.3"), np.array([True, False, False]))
