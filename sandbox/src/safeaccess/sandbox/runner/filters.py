"""Evaluate a parsed `where` filter against a DataFrame, with SQL's three-valued logic.

Null semantics (as in SQL): a comparison, `in` or `between` involving a missing value is
*unknown*. `not unknown` is unknown, `false and unknown` is false, `true or unknown` is true
(Kleene logic), and a row is kept only when the whole filter is *true*. So `not (age > 30)` does
not select the rows whose age is missing; `age is null` (never unknown) does.

Types: a numeric column is compared with numbers (true/false count as 1/0); a text column
(including pandas categoricals whose categories are text) with quoted strings, by value (ordering
comparisons are lexicographic). Comparing a numeric column with a string, or a text column with a
number, raises `FilterError`: silently false would hide a mistake in the analysis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from safeaccess.client.dateparts import parse_part
from safeaccess.client.grammar import (
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
    parse_filter,
)
from safeaccess.sandbox.runner.date_parts import part_values

ColumnKind = Literal["number", "string", "empty"]


class FilterError(ValueError):
    """A filter that cannot be applied to this data: unknown column, or mismatched types."""


@dataclass(frozen=True)
class _Column:
    kind: ColumnKind
    values: np.ndarray  # float64 for numbers, object (str) for strings
    null: np.ndarray  # bool


@dataclass(frozen=True)
class _Truth:
    """Three-valued truth per row: `true` and `unknown` are disjoint; the rest is false."""

    true: np.ndarray
    unknown: np.ndarray

    @property
    def false(self) -> np.ndarray:
        return ~(self.true | self.unknown)


def row_mask(frame: pd.DataFrame, where: str | Filter | None) -> np.ndarray:
    """Boolean array (one entry per row of `frame`) of the rows the filter keeps.

    `None` keeps every row. Raises `FilterError` for grammar errors, unknown columns and
    comparisons between mismatched types.
    """
    n = len(frame)
    if where is None:
        return np.ones(n, dtype=bool)
    if isinstance(where, str):
        try:
            where = parse_filter(where)
        except GrammarError as exc:
            raise FilterError(f"invalid filter: {exc}") from exc
    cache: dict[str, _Column] = {}
    return np.asarray(_eval(where, frame, cache).true, dtype=bool)


def _column(frame: pd.DataFrame, name: str, cache: dict[str, _Column]) -> _Column:
    if name in cache:
        return cache[name]
    part = parse_part(name) if name not in frame.columns else None
    if part is not None and part[1] in frame.columns:
        # `year(admitted)`: the integer part of each date, as a grouping by it computes it
        series = part_values(frame[part[1]], part[0])
    elif name not in frame.columns:
        raise FilterError(f"the filter uses column {name!r}, which is not in the dataset")
    else:
        series = frame[name]
    if isinstance(series.dtype, pd.CategoricalDtype):
        # Compare a categorical by its values, never by its internal codes.
        series = series.astype(
            series.cat.categories.dtype if len(series.cat.categories) else object
        )
    if series.dtype == object and pd.api.types.infer_dtype(series, skipna=True) == "date":
        # Python dates (a Parquet date32 column as pandas reads it): compared as dates too
        series = pd.to_datetime(series)
    null = np.asarray(pd.isna(series), dtype=bool)
    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        # A date column is compared with 'YYYY-MM-DD' strings (validation checks the form):
        # as ISO text, dates order as the days do.
        text = np.full(len(series), "", dtype=object)
        text[~null] = np.datetime_as_string(
            np.asarray(series[~null], dtype="datetime64[D]"), unit="D"
        )
        col = _Column("string", text, null)
        cache[name] = col
        return col
    kind = _kind_of(series, null, name)
    if kind == "number":
        values = np.zeros(len(series), dtype=np.float64)
        values[~null] = np.asarray(series[~null], dtype=np.float64)
    elif kind == "string":
        values = np.asarray(series.astype(object), dtype=object)
    else:
        values = np.zeros(len(series), dtype=np.float64)
    col = _Column(kind, values, null)
    cache[name] = col
    return col


def _kind_of(series: pd.Series, null: np.ndarray, name: str) -> ColumnKind:
    if null.all():
        return "empty"
    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_numeric_dtype(dtype):
        return "number"
    inferred = pd.api.types.infer_dtype(series, skipna=True)
    if inferred in ("string",):
        return "string"
    if inferred in ("integer", "floating", "mixed-integer-float", "boolean", "decimal"):
        return "number"
    raise FilterError(
        f"column {name!r} holds values of mixed or unsupported type ({inferred}); "
        "it cannot be used in a filter"
    )


def _check_literal(col: _Column, value: Scalar, name: str) -> float | str:
    """The literal as it will be compared with the column, or a FilterError on a type mismatch."""
    if isinstance(value, str):
        if col.kind == "number":
            raise FilterError(
                f"column {name!r} is numeric but is compared with the string {value!r}; "
                "compare it with a number"
            )
        return value
    if col.kind == "string":
        shown = "true" if value is True else "false" if value is False else repr(value)
        raise FilterError(
            f"column {name!r} holds text but is compared with {shown}; "
            "compare it with a quoted string such as '1'"
        )
    return float(value)


_OPS: dict[str, Callable[[np.ndarray, object], np.ndarray]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _compare(col: _Column, op: str, literal: float | str) -> np.ndarray:
    """Elementwise comparison on the non-null rows; null rows come back False."""
    out = np.zeros(len(col.values), dtype=bool)
    present = ~col.null
    if col.kind == "empty" or not present.any():
        return out
    out[present] = np.asarray(_OPS[op](col.values[present], literal), dtype=bool)
    return out


def _eval(node: Filter, frame: pd.DataFrame, cache: dict[str, _Column]) -> _Truth:
    if isinstance(node, IsNull):
        col = _column(frame, node.column, cache)
        is_null = col.null if not node.negated else ~col.null
        return _Truth(is_null.copy(), np.zeros(len(frame), dtype=bool))
    if isinstance(node, Compare):
        col = _column(frame, node.column, cache)
        lit = _check_literal(col, node.value, node.column)
        return _Truth(_compare(col, node.op, lit), col.null.copy())
    if isinstance(node, In):
        col = _column(frame, node.column, cache)
        lits = [_check_literal(col, v, node.column) for v in node.values]
        hit = np.zeros(len(frame), dtype=bool)
        for lit in lits:
            hit |= _compare(col, "==", lit)
        if node.negated:
            hit = ~hit & ~col.null
        return _Truth(hit, col.null.copy())
    if isinstance(node, Between):
        col = _column(frame, node.column, cache)
        low = _check_literal(col, node.low, node.column)
        high = _check_literal(col, node.high, node.column)
        inside = _compare(col, ">=", low) & _compare(col, "<=", high)
        if node.negated:
            inside = ~inside & ~col.null
        return _Truth(inside, col.null.copy())
    if isinstance(node, Not):
        inner = _eval(node.operand, frame, cache)
        return _Truth(inner.false, inner.unknown)
    if isinstance(node, And):
        parts = [_eval(o, frame, cache) for o in node.operands]
        true = np.logical_and.reduce([p.true for p in parts])
        false = np.logical_or.reduce([p.false for p in parts])
        return _Truth(true, ~(true | false))
    if isinstance(node, Or):
        parts = [_eval(o, frame, cache) for o in node.operands]
        true = np.logical_or.reduce([p.true for p in parts])
        false = np.logical_and.reduce([p.false for p in parts])
        return _Truth(true, ~(true | false))
    raise FilterError(f"not a filter node: {type(node).__name__}")


__all__ = ["FilterError", "row_mask"]
