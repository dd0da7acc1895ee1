"""Where the records of a storage "duckdb" dataset fall in a table, by DuckDB queries.

The table-independent half of `duckdb_tables`: a `TableJob` (the Parquet source, the filter as
SQL and a DuckDB connection: every query streams the file once), the value combinations of the
key variables among the selected records (`GROUP BY`), their levels by the in-memory rule
(`rules.tabulate.code_levels`), the size check, the body counts, the layout of margins, and
each stored record's cell as one streaming pass (the query set).
"""

# S608 flags f-string SQL: here the text holds only declared column names (checked against the
# schema, then quoted), integers computed in this module and `?` placeholders; every value a
# researcher wrote (filter literals) and every data value (levels) is a bound parameter.
# ruff: noqa: S608

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from safeaccess.client.analyses import Analysis
from safeaccess.client.dateparts import parse_part
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import Label
from safeaccess.rules.tabulate import code_levels
from safeaccess.sandbox.runner.columns import needed_columns
from safeaccess.sandbox.runner.compute._common import (
    MAX_CELLS,
    AnalysisError,
    require_columns,
    too_many_groups,
)
from safeaccess.sandbox.runner.compute.tables import TOO_MANY
from safeaccess.sandbox.runner.duckdb_filter import SqlFilter, translate
from safeaccess.sandbox.runner.duckdb_source import (
    BATCH_ROWS,
    DatasetFile,
    ParquetSource,
    connect,
)


@dataclass(frozen=True)
class Key:
    """One key variable of the table: its name, SQL, declared levels (None: by the rule)."""

    name: str
    sql: str
    declared: list[Label] | None
    fixed: list[Label] | None = None  # a histogram's bins: these levels, the SQL gives the code
    params: tuple[object, ...] = ()  # the bound parameters of `sql`, in order


@dataclass(frozen=True)
class KeyCodes:
    """A key's levels, and its SQL code lookup: parameters `values` -> `codes`."""

    levels: list[Label]
    values: list[Any]
    codes: list[int]
    value_type: str


class TableJob:
    """One table's queries over one dataset: the source, the filter and a DuckDB connection."""

    def __init__(
        self, analysis: Analysis, dataset: DatasetFile, metadata: DatasetMetadata, threads: int
    ) -> None:
        self.source = ParquetSource(dataset)
        wanted = needed_columns(analysis, metadata) or [c.name for c in metadata.columns]
        file_types = self.source.types()
        # As in memory: the job sees the declared columns the file holds, nothing else.
        self.types = {c: file_types[c] for c in wanted if c in file_types}
        self.filter: SqlFilter = translate(analysis.where, self.types)
        self.con = connect(threads)
        self.passes = 0  # passes over the file so far (each query streams it once)
        if not self.types:
            raise AnalysisError("unknown_variable", "the analysis uses no variable of the dataset")

    def query(self, sql: str, params: list[object]) -> duckdb.DuckDBPyRelation:
        """`sql` over a fresh stream of the analysis's columns, registered as `src` (a relation:
        its Arrow results stream without the copy a DB-API result makes)."""
        self.passes += 1
        self.con.register("src", self.source.reader(list(self.types)))
        return self.con.sql(sql, params=params)

    def table(self, sql: str, params: list[object]) -> pa.Table:
        """The whole (small) result of `sql` as an Arrow table."""
        result = self.query(sql, params).to_arrow_table()
        assert result is not None  # a query with a result set gives a table
        return result

    def stream(self, sql: str, params: list[object]) -> pa.RecordBatchReader:
        """The result of `sql` as a stream of batches, in order (for per-record results)."""
        reader = self.query(sql, params).to_arrow_reader(BATCH_ROWS)
        assert reader is not None
        return reader

    def pad(self, passes: int) -> None:
        """Read the file until `passes` passes have been made (decoding the same columns)."""
        while self.passes < passes:
            self.query("SELECT count(*) FROM src", []).fetchall()

    def selected(self) -> int:
        """How many records the filter selects."""
        f = self.filter
        row = self.query(f"SELECT count(*) FROM src WHERE {f.sql}", list(f.params)).fetchall()[0]
        return int(row[0]) if row else 0

    def require(self, names: list[str]) -> None:
        """The in-memory order of refusals: no selected record, then an unknown variable."""
        # a date part (`year(admitted)`) is there when its date column is
        names = [p[1] if (p := parse_part(n)) is not None else n for n in names]
        if any(n not in self.types for n in names):
            if self.selected() == 0:
                raise no_rows()
            require_columns(pd.DataFrame(columns=list(self.types)), names)


def no_rows() -> AnalysisError:
    """The refusal of an analysis no record satisfies (the in-memory path's words)."""
    return AnalysisError("no_rows", "no records satisfy the filter; widen the 'where' condition")


def _sql_type(dtype: pa.DataType) -> str:
    if pa.types.is_boolean(dtype):
        return "BOOLEAN"
    if pa.types.is_integer(dtype):
        return "BIGINT"
    if pa.types.is_floating(dtype):
        return "DOUBLE"
    return "VARCHAR"


def combinations(job: TableJob, keys: list[Key]) -> pa.Table:
    """Each value combination of the keys among the selected records, with its count `n`."""
    f = job.filter
    # Every value a key takes is one of its levels, so combinations (each key's levels plus
    # missing) number at most 2 ** keys times the table's cells: beyond that the table has more
    # than MAX_CELLS cells, and counting stops. (Only a key with no value at all among the
    # selected records escapes this bound: then the in-memory path may answer an empty table
    # where this one refuses.)
    cap = MAX_CELLS * 2 ** len(keys) + 1
    select = ", ".join(f"{k.sql} AS k{i}" for i, k in enumerate(keys))
    params = [p for k in keys for p in k.params]
    group = ", ".join(f"k{i}" for i in range(len(keys)))
    sql = f"SELECT {select}, count(*) AS n FROM src WHERE {f.sql} GROUP BY {group} LIMIT {cap}"
    combos = job.table(sql, [*params, *f.params])
    if combos.num_rows >= cap:
        raise AnalysisError("too_many_cells", TOO_MANY)
    if combos.num_rows == 0:
        raise no_rows()
    return combos


def code_keys(combos: pa.Table, keys: list[Key]) -> tuple[list[KeyCodes], list[np.ndarray]]:
    """Levels of every key by the in-memory rule, and each combination's code per key."""
    coded: list[KeyCodes] = []
    per_combo: list[np.ndarray] = []
    for i, key in enumerate(keys):
        column = combos.column(f"k{i}")
        if key.fixed is not None:
            raw = column.to_numpy(zero_copy_only=False)
            codes = np.where(pd.isna(raw), -1, np.nan_to_num(raw, nan=-1)).astype(np.int64)
            coded.append(KeyCodes(key.fixed, [], [], "BIGINT"))
            per_combo.append(codes)
            continue
        series = pd.Series(column.to_pandas(), name=key.name)
        codes, levels = code_levels(series, key.declared)
        values = column.to_pylist()
        keep = [j for j, v in enumerate(values) if v is not None and codes[j] >= 0]
        pairs = dict((values[j], int(codes[j])) for j in keep)
        coded.append(KeyCodes(levels, list(pairs), list(pairs.values()), _sql_type(column.type)))
        per_combo.append(np.asarray(codes, dtype=np.int64))
    return coded, per_combo


def check_size(keys: list[Key], coded: list[KeyCodes], n_rows: int, too_many: str) -> None:
    """Refuse a table of more than MAX_CELLS cells, as `tabulate` does (rows, cols, table)."""
    sizes = [len(c.levels) for c in coded]
    sides = [
        ([k.name for k in keys[:n_rows]], math.prod(max(s, 1) for s in sizes[:n_rows])),
        ([k.name for k in keys[n_rows:]], math.prod(max(s, 1) for s in sizes[n_rows:])),
    ]
    for names, size in sides:
        if size > MAX_CELLS:
            raise AnalysisError("too_many_cells", too_many_groups(names, size))
    if math.prod(sizes) > MAX_CELLS:
        raise AnalysisError("too_many_cells", too_many)


def _radix(codes: list[Any], sizes: list[int]) -> Any:
    """Mixed-radix code of `codes` (each >= 0) with radices `sizes`, as `tabulate._combine`."""
    out: Any = 0
    for c, s in zip(codes, sizes, strict=True):
        out = out * max(s, 1) + c
    return out


def _radix_sql(names: list[str], sizes: list[int]) -> str:
    """`_radix` as a SQL expression over the code columns `names`."""
    out = "0"
    for name, size in zip(names, sizes, strict=True):
        out = f"({out}) * {max(size, 1)} + {name}"
    return out


def _product(levels: list[list[Label]]) -> list[list[Label]]:
    labels: list[list[Label]] = [[]]
    for lv in levels:
        labels = [[*lab, x] for lab in labels for x in lv]
    return labels


@dataclass
class Placed:
    """Where the selected records fall: levels, labels, the SQL of each record's cell."""

    keys: list[Key]
    coded: list[KeyCodes]
    n_rows: int
    body_counts: np.ndarray
    row_labels: list[list[Label]]
    col_labels: list[list[Label]]

    @property
    def ncells(self) -> int:
        return len(self.row_labels) * len(self.col_labels)

    def cell_sql(self) -> tuple[str, list[str], list[object]]:
        """Per record: the SQL of each key's code (-1: missing or undeclared) with their
        parameters, and the expression combining them into a body cell (-1: a key missing)."""
        parts: list[str] = []
        params: list[object] = []
        for i, (key, c) in enumerate(zip(self.keys, self.coded, strict=True)):
            if key.fixed is not None:
                parts.append(f"coalesce({key.sql}, -1) AS c{i}")
                params += key.params
                continue
            parts.append(
                f"coalesce(list_extract(?::BIGINT[], list_position(?::{c.value_type}[], "
                f"{key.sql})), -1) AS c{i}"
            )
            params += [c.codes, c.values, *key.params]
        sizes = [len(c.levels) for c in self.coded]
        names = [f"c{i}" for i in range(len(self.keys))]
        rows = _radix_sql(names[: self.n_rows], sizes[: self.n_rows])
        cols = (
            _radix_sql(names[self.n_rows :], sizes[self.n_rows :]) if names[self.n_rows :] else None
        )
        nc = len(self.col_labels)
        cell = f"({rows}) * {nc} + ({cols})" if cols is not None else f"({rows})"
        valid = " AND ".join(f"{n} >= 0" for n in names)
        return f"CASE WHEN {valid} THEN {cell} ELSE -1 END", parts, params


def place(job: TableJob, keys: list[Key], n_rows: int, too_many: str) -> Placed:
    combos = combinations(job, keys)
    coded, per_combo = code_keys(combos, keys)
    check_size(keys, coded, n_rows, too_many)
    sizes = [len(c.levels) for c in coded]
    row_labels = _product([c.levels for c in coded[:n_rows]])
    col_labels = _product([c.levels for c in coded[n_rows:]])
    nc = len(col_labels)
    valid = np.logical_and.reduce([c >= 0 for c in per_combo])
    safe = [np.maximum(c, 0) for c in per_combo]
    rows = _radix(safe[:n_rows], sizes[:n_rows]) if n_rows else 0
    cols = _radix(safe[n_rows:], sizes[n_rows:]) if keys[n_rows:] else None
    cell = np.asarray(rows * nc + cols if cols is not None else rows + 0 * safe[0])
    counts = combos.column("n").to_numpy().astype(np.int64)
    body = np.bincount(cell[valid], weights=counts[valid], minlength=len(row_labels) * nc)
    return Placed(keys, coded, n_rows, body.astype(np.int64), row_labels, col_labels)


def record_cells(job: TableJob, table: Placed, value: str | None = None) -> np.ndarray:
    """Every stored record's body cell, in stored order: -1 when the filter does not select
    it, a key is missing, or (with a magnitude `value` SQL) its value is missing."""
    cell, parts, params = table.cell_sql()
    f = job.filter
    inner = ", ".join(parts)
    keep = "keep" if value is None else "keep AND v IS NOT NULL"
    with_value = "" if value is None else f", {value} AS v"
    sql = (
        f"SELECT (CASE WHEN {keep} THEN {cell} ELSE -1 END)::INTEGER AS cell FROM "
        f"(SELECT {inner}{with_value}, coalesce({f.sql}, FALSE) AS keep FROM src)"
    )
    out = np.empty(job.source.num_rows, dtype=np.int32)
    at = 0
    for batch in job.stream(sql, [*params, *f.params]):
        part = batch.column(0).to_numpy()
        out[at : at + len(part)] = part
        at += len(part)
    if at != len(out):  # the stream must give one row per stored record, in order
        raise AnalysisError("dataset_unreadable", "the dataset could not be read as Parquet")
    return out
