"""Tables: frequency tables, magnitude tables (sum/mean/std/mode) and histograms -> TableOutput.

Layout: rows are the level combinations of the row variables, columns those of the column
variables (a one-way table has one column labelled []). Every declared level appears, so cells
with zero records are visible to the checks. Records with a missing row/column variable are in no
cell. With margins, a last row and (for two-way tables) a last column labelled ["All"] hold the
totals; the query set indexes only the inner cells (row-major), since a record lies in several
margin cells at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from safeaccess.client.analyses import FrequencyTable, Histogram, MagnitudeTable
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import TableOutput
from safeaccess.rules.table_facts import cell_names
from safeaccess.rules.tabulate import Coded, Tabulated, TooManyCells, tabulate
from safeaccess.sandbox.runner.compute import missing
from safeaccess.sandbox.runner.compute._common import (
    MAX_CELLS,
    AnalysisError,
    declared_levels,
    group,
    numeric_values,
    query_set,
    require_columns,
    too_many_groups,
)
from safeaccess.sandbox.runner.stored_codes import key_for

TOO_MANY = f"the table would have more than {MAX_CELLS} cells; use fewer levels"


def _tabulate(
    frame: pd.DataFrame,
    rows: list[str],
    cols: list[str],
    metadata: DatasetMetadata,
    too_many: str,
    bins: Coded | None = None,
    **how: Any,
) -> Tabulated:
    """The table of `rows` x `cols` (then `bins`) by the variables' declared levels (from the
    dataset's stored codes where it has them); a table of more than MAX_CELLS cells is refused
    with `too_many`, a side of more with its variables."""
    names = [*rows, *cols]
    levels = [declared_levels(metadata, v) for v in names] + ([None] if bins else [])
    try:
        return tabulate(
            [key_for(frame, v, metadata) for v in rows],
            [key_for(frame, v, metadata) for v in cols] + ([bins] if bins else []),
            levels=levels,
            max_cells=MAX_CELLS,
            **how,
        )
    except TooManyCells as exc:
        message = too_many if exc.side == "table" else too_many_groups(exc.names, exc.cells)
        raise AnalysisError("too_many_cells", message) from None


def _released(done: Tabulated, frame: pd.DataFrame, n_records: int) -> TableOutput:
    """The table with its query set over every stored record (names "row | column")."""
    out = done.output
    n_rows = len(out.row_labels) - (1 if out.margins else 0)
    n_cols = len(out.col_labels) - (1 if out.margins and out.col_vars else 0)
    names = cell_names(out.row_labels[:n_rows], out.col_labels[:n_cols])
    out.facts.query_set = query_set(names, frame, done.record_cells(), n_records)
    return out


def frequency_table(
    analysis: FrequencyTable, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> TableOutput:
    """Counts of records by row x column level combinations."""
    require_columns(frame, analysis.rows + analysis.cols)
    done = _tabulate(
        frame,
        analysis.rows,
        analysis.cols,
        metadata,
        TOO_MANY,
        row_names=analysis.rows,
        col_names=analysis.cols,
        margins=analysis.margins,
        source="frequency_table",
    )
    out = _released(done, frame, n_records)
    out.missing, out.facts.missing_query_sets = missing.keys(
        [*analysis.rows, *analysis.cols], frame, metadata, n_records
    )
    return out


def magnitude_table(
    analysis: MagnitudeTable, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> TableOutput:
    """Sum, mean, std or mode of `value` by row x column level combinations, with dominance
    facts (per contributor unit where the dataset declares one)."""
    unit_col = metadata.contributor_column
    needed = [*analysis.rows, *analysis.cols, analysis.value]
    if unit_col is not None:
        needed.append(unit_col)
    require_columns(frame, needed)
    values = numeric_values(frame, analysis.value)
    done = _tabulate(
        frame,
        analysis.rows,
        analysis.cols,
        metadata,
        TOO_MANY,
        row_names=analysis.rows,
        col_names=analysis.cols,
        values=values,
        value_name=analysis.value,
        statistic=analysis.agg,
        margins=analysis.margins,
        contributor=None if unit_col is None else frame[unit_col].to_numpy(),
        source="magnitude_table",
    )
    out = _released(done, frame, n_records)
    # Per body cell, its records whose value is missing (row-major, as the body); then the
    # records in no cell.
    names = [*analysis.rows, *analysis.cols]
    cells = group(frame, names, metadata)
    out.missing, out.facts.missing_query_sets = missing.joined(
        missing.per_group(
            [analysis.value], np.isnan(values), cells.codes, cells.labels, frame, n_records
        ),
        missing.keys(names, frame, metadata, n_records),
    )
    return out


def _bin_label(lo: float, hi: float, last: bool) -> str:
    return f"[{lo:g}, {hi:g}{']' if last else ')'}"


def histogram(
    analysis: Histogram, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> TableOutput:
    """Counts per bin (columns) for each `by` group (rows).

    Bins are half-open [a, b) except the last, which is closed, as in numpy.histogram. With a bin
    count, the edges span the observed range, so the first and last edge are the minimum and
    maximum of the data: they are recorded in `bin_edges` for the checks. Values outside declared
    edges are in no bin.
    """
    require_columns(frame, [analysis.variable, *analysis.by])
    values = numeric_values(frame, analysis.variable)
    present = values[~np.isnan(values)]
    if analysis.edges is not None:
        edges = np.asarray(analysis.edges, dtype=np.float64)
    else:
        if present.size == 0:
            raise AnalysisError(
                "no_rows", f"no records with a value of {analysis.variable} after the filter"
            )
        edges = np.histogram_bin_edges(present, bins=analysis.bins or 10)
    n_bins = len(edges) - 1
    bin_index = np.searchsorted(edges, values, side="right") - 1
    bin_index[values == edges[-1]] = n_bins - 1
    outside = np.isnan(values) | (values < edges[0]) | (values > edges[-1])
    bin_index[outside] = -1
    bins = Coded(
        analysis.variable,
        bin_index,
        [_bin_label(edges[i], edges[i + 1], i == n_bins - 1) for i in range(n_bins)],
    )
    done = _tabulate(
        frame,
        analysis.by,
        [],
        metadata,
        f"the histogram would have more than {MAX_CELLS} cells",
        bins=bins,
        row_names=analysis.by,
        col_names=[analysis.variable],
        value_name=analysis.variable,
        source="histogram",
    )
    out = _released(done, frame, n_records)
    out.bin_edges = [float(e) for e in edges]
    # Edges computed from the data reveal its minimum and maximum; declared ones do not.
    out.facts.bin_edges_from_data = analysis.edges is None
    # Per `by` group, its records whose value is missing; then the records in no group.
    groups = group(frame, list(analysis.by), metadata)
    out.missing, out.facts.missing_query_sets = missing.joined(
        missing.per_group(
            [analysis.variable],
            np.isnan(values),
            groups.codes,
            groups.labels,
            frame,
            n_records,
        ),
        missing.keys(list(analysis.by), frame, metadata, n_records),
    )
    return out
