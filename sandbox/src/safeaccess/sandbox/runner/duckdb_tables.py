"""Tables of a storage "duckdb" dataset: DuckDB SQL over its Parquet file, inside the job.

A dataset registered with `storage: duckdb` in its metadata (one too large for the job's memory)
is never loaded: each table is a few DuckDB queries over Arrow batches of the file
(`duckdb_source`), and gives the same `TableOutput`, cell for cell and fact for fact, as the
in-memory path (`compute/tables.py`), which `tests/sandbox/test_duckdb_tables.py` checks on
random datasets. The steps:

1. the filter becomes SQL with bound parameters (`duckdb_filter`);
2. `GROUP BY` the key variables (histogram: and the bin) counts each value combination among
   the selected records; the levels follow from those few combinations by the server's level
   rule (`rules.tabulate.code_levels`, the in-memory path's own function);
3. a magnitude table sums by cell in SQL (one thread, so each cell's sum adds its records in
   stored order, as `np.bincount` does in memory: the same float, not an approximation);
4. one streaming pass gives every stored record its cell (or -1): the query set.

Kinds and options this path does not compute are refused with `STORAGE_UNSUPPORTED`, decided
from the analysis and the published metadata alone (`refusal`), before any record is read.
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

from safeaccess.client.analyses import Analysis, FrequencyTable, Histogram, MagnitudeTable
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import CellFacts, Label, QuerySet, TableFacts, TableOutput
from safeaccess.rules.tabulate import code_levels
from safeaccess.sandbox.runner.columns import needed_columns
from safeaccess.sandbox.runner.compute._common import (
    MAX_CELLS,
    AnalysisError,
    declared_levels,
    label_text,
    require_columns,
    too_many_groups,
)
from safeaccess.sandbox.runner.compute.tables import TOO_MANY
from safeaccess.sandbox.runner.duckdb_filter import (
    SqlFilter,
    column_sql,
    kind_of,
    number_sql,
    translate,
)
from safeaccess.sandbox.runner.duckdb_source import (
    BATCH_ROWS,
    DatasetFile,
    ParquetSource,
    connect,
)

STORAGE_UNSUPPORTED = "storage_unsupported"
#: Refusals that depend on the records rather than on the analysis and the schema.
DATA_DEPENDENT = frozenset({"no_rows", "too_many_cells"})
SUPPORTED_KINDS = ("frequency_table", "histogram", "magnitude_table")
MAGNITUDE_STATISTICS = ("sum", "mean")
TOP_N = 3


def refusal(analysis: Analysis, metadata: DatasetMetadata) -> AnalysisError | None:
    """Why this analysis cannot run on a storage "duckdb" dataset (None: it can).

    Depends only on the analysis and the published metadata, never on the data."""
    what = (
        f"dataset {metadata.name} is queried out of memory (storage 'duckdb'); there it offers "
        "frequency tables, histograms and magnitude tables of sum or mean"
    )
    if analysis.kind not in SUPPORTED_KINDS:
        return AnalysisError(STORAGE_UNSUPPORTED, f"{analysis.kind} is not available: {what}")
    if isinstance(analysis, MagnitudeTable):
        if analysis.agg not in MAGNITUDE_STATISTICS:
            return AnalysisError(
                STORAGE_UNSUPPORTED, f"magnitude tables of {analysis.agg} are not available: {what}"
            )
        if metadata.contributor_column is not None:
            return AnalysisError(
                STORAGE_UNSUPPORTED,
                "magnitude tables by contributor unit are not available: " + what,
            )
    return None


@dataclass(frozen=True)
class _Key:
    """One key variable of the table: its name, SQL, declared levels (None: by the rule)."""

    name: str
    sql: str
    declared: list[Label] | None
    fixed: list[Label] | None = None  # a histogram's bins: these levels, the SQL gives the code
    params: tuple[object, ...] = ()  # the bound parameters of `sql`, in order


@dataclass(frozen=True)
class _Coded:
    """A key's levels, and its SQL code lookup: parameters `values` -> `codes`."""

    levels: list[Label]
    values: list[Any]
    codes: list[int]
    value_type: str


class _Job:
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
        if any(n not in self.types for n in names):
            if self.selected() == 0:
                raise _no_rows()
            require_columns(pd.DataFrame(columns=list(self.types)), names)


def _no_rows() -> AnalysisError:
    return AnalysisError("no_rows", "no records satisfy the filter; widen the 'where' condition")


def _sql_type(dtype: pa.DataType) -> str:
    if pa.types.is_boolean(dtype):
        return "BOOLEAN"
    if pa.types.is_integer(dtype):
        return "BIGINT"
    if pa.types.is_floating(dtype):
        return "DOUBLE"
    return "VARCHAR"


def _combinations(job: _Job, keys: list[_Key]) -> pa.Table:
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
        raise _no_rows()
    return combos


def _code(combos: pa.Table, keys: list[_Key]) -> tuple[list[_Coded], list[np.ndarray]]:
    """Levels of every key by the in-memory rule, and each combination's code per key."""
    coded: list[_Coded] = []
    per_combo: list[np.ndarray] = []
    for i, key in enumerate(keys):
        column = combos.column(f"k{i}")
        if key.fixed is not None:
            raw = column.to_numpy(zero_copy_only=False)
            codes = np.where(pd.isna(raw), -1, np.nan_to_num(raw, nan=-1)).astype(np.int64)
            coded.append(_Coded(key.fixed, [], [], "BIGINT"))
            per_combo.append(codes)
            continue
        series = pd.Series(column.to_pandas(), name=key.name)
        codes, levels = code_levels(series, key.declared)
        values = column.to_pylist()
        keep = [j for j, v in enumerate(values) if v is not None and codes[j] >= 0]
        pairs = dict((values[j], int(codes[j])) for j in keep)
        coded.append(_Coded(levels, list(pairs), list(pairs.values()), _sql_type(column.type)))
        per_combo.append(np.asarray(codes, dtype=np.int64))
    return coded, per_combo


def _check_size(keys: list[_Key], coded: list[_Coded], n_rows: int, too_many: str) -> None:
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


class _Grid:
    """Body cells plus margins, laid out as `rules.tabulate._Layout` lays them out."""

    def __init__(self, nr: int, nc: int, margins: bool, two_way: bool) -> None:
        self.nr, self.nc, self.margins, self.two_way = nr, nc, margins, two_way

    def grid(self, body: np.ndarray, row: Any, col: Any, corner: Any) -> np.ndarray:
        body = body.reshape(self.nr, self.nc, *body.shape[1:])
        if not self.margins:
            return body
        width = self.nc + 1 if self.two_way else self.nc
        out = np.zeros((self.nr + 1, width, *body.shape[2:]), dtype=body.dtype)
        out[: self.nr, : self.nc] = body
        if self.two_way:
            out[: self.nr, self.nc] = row
            out[self.nr, : self.nc] = col
            out[self.nr, self.nc] = corner
        else:
            out[self.nr, 0] = corner
        return out

    def added(self, body: np.ndarray) -> np.ndarray:
        b = body.reshape(self.nr, self.nc)
        if body.dtype == bool:
            return self.grid(body, b.any(axis=1), b.any(axis=0), b.any())
        return self.grid(body, b.sum(axis=1), b.sum(axis=0), b.sum())


@dataclass
class _Table:
    """Where the selected records fall: levels, labels, the SQL of each record's cell."""

    keys: list[_Key]
    coded: list[_Coded]
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


def _place(job: _Job, keys: list[_Key], n_rows: int, too_many: str) -> _Table:
    combos = _combinations(job, keys)
    coded, per_combo = _code(combos, keys)
    _check_size(keys, coded, n_rows, too_many)
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
    return _Table(keys, coded, n_rows, body.astype(np.int64), row_labels, col_labels)


def _record_cells(job: _Job, table: _Table, value: str | None = None) -> np.ndarray:
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


def _released(table: _Table, out: TableOutput, cells: np.ndarray) -> TableOutput:
    """The output with its query set over every stored record (names "row | column")."""
    names = [
        " | ".join(label_text(part) for part in (r, c) if part) or "all"
        for r in table.row_labels
        for c in table.col_labels
    ]
    out.facts.query_set = QuerySet.from_array(names, cells)
    return out


def _labels(table: _Table, margins: bool, two_way: bool) -> tuple[list[Any], list[Any]]:
    rows, cols = list(table.row_labels), list(table.col_labels)
    if margins:
        rows.append(["All"])
        if two_way:
            cols.append(["All"])
    return rows, cols


def _grid_values(grid: np.ndarray) -> list[list[float | None]]:
    return [[x if math.isfinite(x) else None for x in row] for row in grid.tolist()]


def _count_output(
    table: _Table,
    *,
    source: str,
    row_vars: list[str],
    col_vars: list[str],
    value: str | None,
    margins: bool,
    two_way: bool,
) -> TableOutput:
    layout = _Grid(len(table.row_labels), len(table.col_labels), margins, two_way)
    counts = layout.added(table.body_counts)
    rows, cols = _labels(table, margins, two_way)
    return TableOutput(
        source=source,
        statistic="count",
        value=value,
        row_vars=row_vars,
        col_vars=col_vars,
        row_labels=rows,
        col_labels=cols,
        values=_grid_values(counts.astype(float)),
        margins=margins,
        facts=TableFacts(
            cells=CellFacts(counts=counts.tolist()), n_total=int(table.body_counts.sum())
        ),
    )


def _key(job: _Job, metadata: DatasetMetadata, name: str) -> _Key:
    return _Key(name, column_sql(name, job.types[name]), declared_levels(metadata, name))


def frequency_table(analysis: FrequencyTable, job: _Job, metadata: DatasetMetadata) -> TableOutput:
    """Counts of records by row x column level combinations (as `compute.tables`)."""
    names = [*analysis.rows, *analysis.cols]
    job.require(names)
    keys = [_key(job, metadata, n) for n in names]
    table = _place(job, keys, len(analysis.rows), TOO_MANY)
    out = _count_output(
        table,
        source="frequency_table",
        row_vars=list(analysis.rows),
        col_vars=list(analysis.cols),
        value=None,
        margins=analysis.margins,
        two_way=bool(analysis.cols),
    )
    return _released(table, out, _record_cells(job, table))


def _numeric(job: _Job, name: str) -> str:
    """A numeric variable's SQL; AnalysisError('not_numeric') as `numeric_values` refuses
    (after 'no_rows', as in memory, where the filter runs before the analysis)."""
    if kind_of(job.types[name]) != "number":
        if job.selected() == 0:
            raise _no_rows()
        raise AnalysisError(
            "not_numeric", f"variable {name} is not numeric; this analysis needs a numeric variable"
        )
    return number_sql(name, job.types[name])


def _bin_label(lo: float, hi: float, last: bool) -> str:
    return f"[{lo:g}, {hi:g}{']' if last else ')'}"


def histogram(analysis: Histogram, job: _Job, metadata: DatasetMetadata) -> TableOutput:
    """Counts per bin (columns) for each `by` group (rows), as `compute.tables.histogram`."""
    job.require([analysis.variable, *analysis.by])
    value = _numeric(job, analysis.variable)
    f = job.filter
    if analysis.edges is not None:
        edges = np.asarray(analysis.edges, dtype=np.float64)
    else:
        selected, low, high = job.query(
            f"SELECT count(*), min(v), max(v) FROM (SELECT {value} AS v FROM src WHERE {f.sql})",
            list(f.params),
        ).fetchall()[0]
        if selected == 0:
            raise _no_rows()
        if low is None:
            raise AnalysisError(
                "no_rows", f"no records with a value of {analysis.variable} after the filter"
            )
        # np.histogram_bin_edges with a bin count reads only the minimum and maximum.
        edges = np.histogram_bin_edges(
            np.array([low, high], dtype=np.float64), bins=analysis.bins or 10
        )
    n_bins = len(edges) - 1
    # searchsorted(edges, v, "right") - 1, the last edge closed, values outside in no bin.
    bin_sql = (
        f"(CASE WHEN {value} IS NULL OR {value} < ?::DOUBLE OR {value} > ?::DOUBLE THEN NULL "
        f"WHEN {value} = ?::DOUBLE THEN {n_bins - 1} "
        f"ELSE len(list_filter(?::DOUBLE[], lambda e: e <= {value})) - 1 END)"
    )
    bounds = [float(e) for e in edges]
    bin_params = (bounds[0], bounds[-1], bounds[-1], bounds)
    labels: list[Label] = [
        _bin_label(edges[i], edges[i + 1], i == n_bins - 1) for i in range(n_bins)
    ]
    keys = [_key(job, metadata, n) for n in analysis.by]
    keys.append(_Key(analysis.variable, bin_sql, None, fixed=labels, params=bin_params))
    table = _place(
        job, keys, len(analysis.by), f"the histogram would have more than {MAX_CELLS} cells"
    )
    out = _count_output(
        table,
        source="histogram",
        row_vars=list(analysis.by),
        col_vars=[analysis.variable],
        value=analysis.variable,
        margins=False,
        two_way=True,
    )
    out = _released(table, out, _record_cells(job, table))
    out.bin_edges = [float(e) for e in edges]
    out.facts.bin_edges_from_data = analysis.edges is None
    return out


def _tops(lists: list[Any]) -> np.ndarray:
    """(k, 3) largest values, -inf padded, from DuckDB's `max(v, 3)` lists (None: no value)."""
    out = np.full((len(lists), TOP_N), -np.inf)
    for i, values in enumerate(lists):
        for j, x in enumerate((values or [])[:TOP_N]):
            out[i, j] = x
    return out


def _merged(tops: np.ndarray) -> np.ndarray:
    """The three largest of several cells' -inf padded top three (last two axes)."""
    flat = tops.reshape(*tops.shape[:-2], -1)
    return -np.sort(-flat, axis=-1)[..., :TOP_N]


def _top_lists(grid: np.ndarray) -> list[list[list[float]]]:
    return [[[x for x in cell if x != -np.inf] for cell in row] for row in grid.tolist()]


def magnitude_table(analysis: MagnitudeTable, job: _Job, metadata: DatasetMetadata) -> TableOutput:
    """Sum or mean of `value` by row x column level combinations, with the facts of
    `compute.tables.magnitude_table` (totals, missing, negatives, top three per cell)."""
    names = [*analysis.rows, *analysis.cols]
    job.require([*names, analysis.value])
    value = _numeric(job, analysis.value)
    keys = [_key(job, metadata, n) for n in names]
    table = _place(job, keys, len(analysis.rows), TOO_MANY)
    nr, nc = len(table.row_labels), len(table.col_labels)
    cell, parts, params = table.cell_sql()
    f = job.filter
    base = (
        f"SELECT {cell} AS cell, v FROM (SELECT {', '.join(parts)}, {value} AS v, "
        f"coalesce({f.sql}, FALSE) AS keep FROM src) WHERE keep"
    )
    sets = "(r, c), (r), (c), ()" if analysis.margins else "(r, c)"
    sql = (
        "SELECT grouping(r) AS gr, grouping(c) AS gc, r, c, count(v) AS n, "
        "coalesce(sum(v), 0.0) AS total, max(v, 3) AS top, coalesce(bool_or(v < 0), FALSE) AS neg, "
        f"count(*) - count(v) AS lacking FROM (SELECT cell // {nc} AS r, cell % {nc} AS c, v "
        f"FROM ({base}) WHERE cell >= 0) GROUP BY GROUPING SETS ({sets})"
    )
    got = job.table(sql, [*params, *f.params]).to_pydict()
    n = np.zeros(nr * nc, dtype=np.int64)
    lacking = np.zeros(nr * nc, dtype=np.int64)
    neg = np.zeros(nr * nc, dtype=bool)
    total = np.zeros(nr * nc)
    top_lists: list[Any] = [None] * (nr * nc)
    row_total, col_total, corner = np.zeros(nr), np.zeros(nc), 0.0
    for i, (gr, gc) in enumerate(zip(got["gr"], got["gc"], strict=True)):
        r, c = got["r"][i], got["c"][i]
        if not gr and not gc:
            at = int(r) * nc + int(c)
            n[at], lacking[at], neg[at] = got["n"][i], got["lacking"][i], got["neg"][i]
            total[at], top_lists[at] = got["total"][i], got["top"][i]
        elif not gr:
            row_total[int(r)] = got["total"][i]
        elif not gc:
            col_total[int(c)] = got["total"][i]
        else:
            corner = got["total"][i]
    two_way = bool(analysis.cols)
    layout = _Grid(nr, nc, analysis.margins, two_way)
    counts = layout.added(n)
    totals = layout.grid(total, row_total, col_total, corner) if analysis.margins else total
    totals = totals.reshape(counts.shape)
    tops = _tops(top_lists)
    if analysis.margins:
        shaped = tops.reshape(nr, nc, TOP_N)
        top_grid = layout.grid(
            tops, _merged(shaped), _merged(shaped.transpose(1, 0, 2)), _merged(tops[None, :, :])[0]
        )
    else:
        top_grid = tops.reshape(nr, nc, TOP_N)
    with np.errstate(divide="ignore", invalid="ignore"):
        grid = np.where(counts > 0, totals if analysis.agg == "sum" else totals / counts, np.nan)
    rows, cols = _labels(table, analysis.margins, two_way)
    out = TableOutput(
        source="magnitude_table",
        statistic=analysis.agg,
        value=analysis.value,
        row_vars=list(analysis.rows),
        col_vars=list(analysis.cols),
        row_labels=rows,
        col_labels=cols,
        values=_grid_values(grid),
        margins=analysis.margins,
        facts=TableFacts(
            cells=CellFacts(
                counts=counts.tolist(),
                total=totals.tolist(),
                missing=layout.added(lacking).tolist(),
                negative=layout.added(neg).tolist(),
                top=_top_lists(top_grid),
            ),
            n_total=int(n.sum()),
        ),
    )
    return _released(table, out, _record_cells(job, table, value))


def _passes(analysis: Analysis) -> int:
    """Passes over the file an answer to `analysis` takes: the combinations, (a magnitude
    table's sums, a histogram's range from the data,) each record's cell."""
    if isinstance(analysis, MagnitudeTable):
        return 3
    if isinstance(analysis, Histogram) and analysis.edges is None:
        return 3
    return 2


def execute_out_of_memory(
    analysis: Analysis, dataset: DatasetFile, metadata: DatasetMetadata
) -> TableOutput:
    """Compute `analysis` on a storage "duckdb" dataset (its open Parquet file, descriptor or
    path) without loading it; AnalysisError (STORAGE_UNSUPPORTED for what this path does not
    compute) and FilterError as the in-memory path raises them."""
    refused = refusal(analysis, metadata)
    if refused is not None:
        raise refused
    # One thread for magnitude tables: DuckDB then adds each cell's values in stored order, as
    # np.bincount does in memory, so the totals are the same floats (the differential test
    # compares them exactly).
    job = _Job(
        analysis, dataset, metadata, threads=1 if isinstance(analysis, MagnitudeTable) else 0
    )
    try:
        if isinstance(analysis, FrequencyTable):
            return frequency_table(analysis, job, metadata)
        if isinstance(analysis, Histogram):
            return histogram(analysis, job, metadata)
        assert isinstance(analysis, MagnitudeTable)
        return magnitude_table(analysis, job, metadata)
    except AnalysisError as exc:
        if exc.code in DATA_DEPENDENT:
            # A refusal that depends on the records (none selected, too many levels) takes as
            # many passes over the file as an answer would: at 100 M records a pass takes
            # seconds, and the latency must not tell 0 selected records from 1.
            job.pad(_passes(analysis))
        raise
