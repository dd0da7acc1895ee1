"""Tables of a storage "duckdb" dataset: DuckDB SQL over its Parquet file, inside the job.

A dataset registered with `storage: duckdb` in its metadata (one too large for the job's memory)
is never loaded: each table is a few DuckDB queries over Arrow batches of the file
(`duckdb_source`, `duckdb_cells`), and gives the same `TableOutput`, cell for cell and fact for fact, as the
in-memory path (`compute/tables.py`), which `tests/sandbox/test_duckdb_tables.py` checks on
random datasets. The steps:

1. the filter becomes SQL with bound parameters (`duckdb_filter`);
2. `GROUP BY` the key variables (histogram: and the bin) counts each value combination among
   the selected records; the levels follow from those few combinations by the server's level
   rule (`rules.tabulate.code_levels`, the in-memory path's own function);
3. a magnitude table sums by cell in SQL (one thread, so each cell's sum adds its records in
   stored order, as `np.bincount` does in memory: the same float, not an approximation);
4. one streaming pass gives every stored record its cell (or -1): the query set;
5. the cells become a `TableOutput` through `rules.table_facts`, the one description of a
   table's facts the in-memory path uses too.

Kinds and options this path does not compute are known from the analysis and the published
metadata alone (`refusal`), before any record is read: the runner reads only their columns
instead and computes in memory (`runner._out_of_memory`); a script is refused with
`STORAGE_UNSUPPORTED`.
"""

# S608 flags f-string SQL: here the text holds only declared column names (checked against the
# schema, then quoted), integers computed in this module and `?` placeholders; every value a
# researcher wrote (filter literals) and every data value (levels) is a bound parameter.
# ruff: noqa: S608

from __future__ import annotations

from typing import Any

import numpy as np

from safeaccess.client.analyses import Analysis, FrequencyTable, Histogram, MagnitudeTable
from safeaccess.client.dateparts import parse_part
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import Label, QuerySet, TableOutput
from safeaccess.rules.table_facts import (
    TOP_N,
    CellSums,
    Source,
    TableShape,
    cell_names,
    count_table,
)
from safeaccess.rules.table_facts import (
    magnitude_table as magnitude_output,
)
from safeaccess.sandbox.runner.compute._common import MAX_CELLS, AnalysisError, declared_levels
from safeaccess.sandbox.runner.compute.tables import TOO_MANY
from safeaccess.sandbox.runner.duckdb_cells import (
    Key,
    Placed,
    TableJob,
    no_rows,
    place,
    record_cells,
)
from safeaccess.sandbox.runner.duckdb_filter import column_sql, date_sql, kind_of, number_sql
from safeaccess.sandbox.runner.duckdb_missing import table_missing
from safeaccess.sandbox.runner.duckdb_source import DatasetFile

STORAGE_UNSUPPORTED = "storage_unsupported"
#: Refusals that depend on the records rather than on the analysis and the schema.
DATA_DEPENDENT = frozenset({"no_rows", "too_many_cells"})
SUPPORTED_KINDS = ("frequency_table", "histogram", "magnitude_table")
MAGNITUDE_STATISTICS = ("sum", "mean")


def refusal(analysis: Analysis, metadata: DatasetMetadata) -> AnalysisError | None:
    """Why DuckDB cannot compute this analysis over the file (None: it can); the runner then
    reads the analysis's columns instead (`runner._out_of_memory`).

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


def _released(table: Placed, out: TableOutput, cells: np.ndarray) -> TableOutput:
    """The output with its query set over every stored record (names "row | column")."""
    out.facts.query_set = QuerySet.from_array(cell_names(table.row_labels, table.col_labels), cells)
    return out


def _shape(
    table: Placed,
    source: Source,
    row_vars: list[str],
    col_vars: list[str],
    value: str | None,
    margins: bool,
) -> TableShape:
    return TableShape(
        source=source,
        row_vars=row_vars,
        col_vars=col_vars,
        row_labels=table.row_labels,
        col_labels=table.col_labels,
        margins=margins,
        two_way=bool(col_vars),
        value=value,
    )


def _key(job: TableJob, metadata: DatasetMetadata, name: str) -> Key:
    parsed = parse_part(name) if "(" in name else None
    if parsed is not None:  # `year(admitted)`: DuckDB's year() of the date, as pandas' dt.year
        part, base = parsed
        sql = f"{part}({date_sql(base, job.types[base])})"
        return Key(name, sql, declared_levels(metadata, name))
    return Key(name, column_sql(name, job.types[name]), declared_levels(metadata, name))


def frequency_table(
    analysis: FrequencyTable, job: TableJob, metadata: DatasetMetadata
) -> TableOutput:
    """Counts of records by row x column level combinations (as `compute.tables`)."""
    names = [*analysis.rows, *analysis.cols]
    job.require(names)
    keys = [_key(job, metadata, n) for n in names]
    table = place(job, keys, len(analysis.rows), TOO_MANY)
    shape = _shape(
        table, "frequency_table", list(analysis.rows), list(analysis.cols), None, analysis.margins
    )
    out = count_table(shape, table.body_counts)
    out = _released(table, out, record_cells(job, table))
    out.missing, out.facts.missing_query_sets = table_missing(job, table, names, None, 0)
    return out


def _numeric(job: TableJob, name: str) -> str:
    """A numeric variable's SQL; AnalysisError('not_numeric') as `numeric_values` refuses
    (after 'no_rows', as in memory, where the filter runs before the analysis)."""
    if kind_of(job.types[name]) != "number":
        if job.selected() == 0:
            raise no_rows()
        raise AnalysisError(
            "not_numeric", f"variable {name} is not numeric; this analysis needs a numeric variable"
        )
    return number_sql(name, job.types[name])


def _bin_label(lo: float, hi: float, last: bool) -> str:
    return f"[{lo:g}, {hi:g}{']' if last else ')'}"


def histogram(analysis: Histogram, job: TableJob, metadata: DatasetMetadata) -> TableOutput:
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
            raise no_rows()
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
    keys.append(Key(analysis.variable, bin_sql, None, fixed=labels, params=bin_params))
    table = place(
        job, keys, len(analysis.by), f"the histogram would have more than {MAX_CELLS} cells"
    )
    shape = _shape(
        table, "histogram", list(analysis.by), [analysis.variable], analysis.variable, False
    )
    out = count_table(shape, table.body_counts)
    out = _released(table, out, record_cells(job, table))
    out.bin_edges = [float(e) for e in edges]
    out.facts.bin_edges_from_data = analysis.edges is None
    out.missing, out.facts.missing_query_sets = table_missing(
        job, table, list(analysis.by), (analysis.variable, value), len(analysis.by)
    )
    return out


def _tops(lists: list[Any]) -> np.ndarray:
    """(k, 3) largest values, -inf padded, from DuckDB's `max(v, 3)` lists (None: no value)."""
    out = np.full((len(lists), TOP_N), -np.inf)
    for i, values in enumerate(lists):
        for j, x in enumerate((values or [])[:TOP_N]):
            out[i, j] = x
    return out


def magnitude_table(
    analysis: MagnitudeTable, job: TableJob, metadata: DatasetMetadata
) -> TableOutput:
    """Sum or mean of `value` by row x column level combinations, with the facts of
    `compute.tables.magnitude_table` (totals, missing, negatives, top three per cell)."""
    names = [*analysis.rows, *analysis.cols]
    job.require([*names, analysis.value])
    value = _numeric(job, analysis.value)
    keys = [_key(job, metadata, n) for n in names]
    table = place(job, keys, len(analysis.rows), TOO_MANY)
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
    shape = _shape(
        table,
        "magnitude_table",
        list(analysis.rows),
        list(analysis.cols),
        analysis.value,
        analysis.margins,
    )
    layout = shape.layout
    totals = layout.grid(total, row_total, col_total, corner) if analysis.margins else total
    sums = CellSums(
        counts=n,
        total=totals.reshape(layout.height, layout.width),
        missing=lacking,
        negative=neg,
        top=layout.largest(_tops(top_lists)),
    )
    out = magnitude_output(shape, analysis.agg, sums)
    out = _released(table, out, record_cells(job, table, value))
    out.missing, out.facts.missing_query_sets = table_missing(
        job, table, names, (analysis.value, value), len(names)
    )
    return out


def _passes(analysis: Analysis) -> int:
    """Passes over the file an answer to `analysis` takes: the combinations, (a magnitude
    table's sums, a histogram's range from the data,) each record's cell, its missing values."""
    if isinstance(analysis, MagnitudeTable):
        return 4
    if isinstance(analysis, Histogram) and analysis.edges is None:
        return 4
    return 3


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
    job = TableJob(
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
