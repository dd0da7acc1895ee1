"""A parsed `where` filter as DuckDB SQL with bound parameters (storage "duckdb" datasets).

The same semantics as `runner/filters.py` (the in-memory path), which the differential test
holds both to: SQL's three-valued logic is the Kleene logic `filters.py` implements, a NaN is
missing (DuckDB treats NaN as a value, so float columns go through `column_sql`), a numeric
column is compared as float64 with numbers (booleans count as 1/0), a text column with strings,
and a type mismatch raises `FilterError`. The column kinds come from the Parquet schema.

Researcher values never enter the SQL text: every literal is a `?` parameter, and column names
are only the dataset's declared names (checked against the schema, then quoted).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

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
from safeaccess.sandbox.runner.filters import ColumnKind, FilterError

_SQL_OPS = {"==": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def quoted(name: str) -> str:
    """A column name as a SQL identifier (declared names match [A-Za-z_][A-Za-z0-9_]*)."""
    return '"' + name.replace('"', '""') + '"'


def kind_of(dtype: pa.DataType) -> ColumnKind | None:
    """How the filter compares a column of this Arrow type (None: not comparable)."""
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if pa.types.is_boolean(dtype) or pa.types.is_integer(dtype) or pa.types.is_floating(dtype):
        return "number"
    if pa.types.is_decimal(dtype):
        return "number"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "string"
    if pa.types.is_null(dtype):
        return "empty"
    if pa.types.is_date(dtype) or pa.types.is_timestamp(dtype):
        return "string"  # compared as 'YYYY-MM-DD' text, as in memory (`date_sql`)
    return None


def date_sql(name: str, dtype: pa.DataType) -> str:
    """A date column as a SQL DATE (NULL where missing, or where text is not a 'YYYY-MM-DD'
    date, as `runner.date_parts.as_dates` reads it)."""
    col = quoted(name)
    if pa.types.is_date(dtype) or pa.types.is_timestamp(dtype):
        return f"CAST({col} AS DATE)"
    return f"try_strptime(CAST({col} AS VARCHAR), '%Y-%m-%d')::DATE"


def column_sql(name: str, dtype: pa.DataType) -> str:
    """The column as SQL with pandas' idea of missing: NaN is NULL; a dictionary column is read
    as its values."""
    col = quoted(name)
    if pa.types.is_date(dtype) or pa.types.is_timestamp(dtype):
        # The in-memory filter compares a date column as ISO text: as the days order.
        return f"strftime({date_sql(name, dtype)}, '%Y-%m-%d')"
    if pa.types.is_dictionary(dtype):
        inner = dtype.value_type
        col = f"CAST({col} AS {'VARCHAR' if kind_of(inner) == 'string' else 'DOUBLE'})"
        dtype = inner
    if pa.types.is_floating(dtype):
        return f"(CASE WHEN isnan({col}) THEN NULL ELSE {col} END)"
    return col


def number_sql(name: str, dtype: pa.DataType) -> str:
    """The column as DOUBLE (NaN as NULL), as `numeric_values` reads it."""
    return f"CAST({column_sql(name, dtype)} AS DOUBLE)"


@dataclass
class SqlFilter:
    """The filter as a SQL boolean expression and its parameters, in order."""

    sql: str
    params: list[object] = field(default_factory=list)
    columns: frozenset[str] = frozenset()


def translate(where: str | None, schema: dict[str, pa.DataType]) -> SqlFilter:
    """The `where` filter over columns of `schema` (name -> Arrow type) as SQL.

    Raises FilterError for grammar errors, unknown columns and mismatched types (as the
    in-memory filter does)."""
    if where is None or not where.strip():
        return SqlFilter("TRUE")
    try:
        node = parse_filter(where)
    except GrammarError as exc:
        raise FilterError(f"invalid filter: {exc}") from exc
    params: list[object] = []
    used: set[str] = set()
    sql = _node(node, schema, params, used)
    return SqlFilter(sql, params, frozenset(used))


def _column(name: str, schema: dict[str, pa.DataType], used: set[str]) -> tuple[str, ColumnKind]:
    part = parse_part(name) if name not in schema else None
    if part is not None and part[1] in schema:
        # `year(admitted)`: DuckDB's year() of the date, compared as a number (as in memory)
        used.add(part[1])
        return f"CAST({part[0]}({date_sql(part[1], schema[part[1]])}) AS DOUBLE)", "number"
    if name not in schema:
        raise FilterError(f"the filter uses column {name!r}, which is not in the dataset")
    kind = kind_of(schema[name])
    if kind is None:
        raise FilterError(
            f"column {name!r} holds values of mixed or unsupported type; "
            "it cannot be used in a filter"
        )
    used.add(name)
    dtype = schema[name]
    sql = number_sql(name, dtype) if kind == "number" else column_sql(name, dtype)
    return sql, kind


def _literal(kind: ColumnKind, value: Scalar, name: str) -> float | str | None:
    """The parameter compared with the column, or FilterError on a type mismatch (the messages
    of `filters._check_literal`). None: an all-missing column, where nothing compares true."""
    if isinstance(value, str):
        if kind == "number":
            raise FilterError(
                f"column {name!r} is numeric but is compared with the string {value!r}; "
                "compare it with a number"
            )
        return value if kind == "string" else None
    if kind == "string":
        shown = "true" if value is True else "false" if value is False else repr(value)
        raise FilterError(
            f"column {name!r} holds text but is compared with {shown}; "
            "compare it with a quoted string such as '1'"
        )
    return float(value) if kind == "number" else None


def _node(
    node: Filter, schema: dict[str, pa.DataType], params: list[object], used: set[str]
) -> str:
    if isinstance(node, IsNull):
        col, _ = _column(node.column, schema, used)
        return f"({col} IS {'NOT ' if node.negated else ''}NULL)"
    if isinstance(node, Compare):
        col, kind = _column(node.column, schema, used)
        params.append(_literal(kind, node.value, node.column))
        return f"({col} {_SQL_OPS[node.op]} ?)"
    if isinstance(node, In):
        col, kind = _column(node.column, schema, used)
        values = [_literal(kind, v, node.column) for v in node.values]
        params.extend(values)
        marks = ", ".join("?" for _ in values)
        return f"({col} {'NOT ' if node.negated else ''}IN ({marks}))"
    if isinstance(node, Between):
        col, kind = _column(node.column, schema, used)
        params.append(_literal(kind, node.low, node.column))
        params.append(_literal(kind, node.high, node.column))
        return f"({col} {'NOT ' if node.negated else ''}BETWEEN ? AND ?)"
    if isinstance(node, Not):
        return f"(NOT {_node(node.operand, schema, params, used)})"
    if isinstance(node, And | Or):
        joiner = " AND " if isinstance(node, And) else " OR "
        return "(" + joiner.join(_node(o, schema, params, used) for o in node.operands) + ")"
    raise FilterError(f"not a filter node: {type(node).__name__}")
