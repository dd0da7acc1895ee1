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
from safeaccess.rules.facts import cell_spread_and_mode
from safeaccess.rules.outputs import CellFacts, Label, TableFacts, TableOutput
from safeaccess.sandbox.compute._common import (
    MAX_CELLS,
    AnalysisError,
    Cells,
    code_variable,
    combine,
    fnum,
    label_text,
    numeric_values,
    query_set,
    require_columns,
)

ALL: list[Label] = ["All"]
TOP_N = 3


def _layout(
    frame: pd.DataFrame, rows: list[str], cols: list[str], metadata: DatasetMetadata
) -> tuple[Cells, Cells, np.ndarray]:
    """Row cells, column cells and the inner cell index (row-major, -1 = in no cell) per record."""
    n = len(frame)
    row_cells = combine([code_variable(frame, v, metadata) for v in rows], n)
    col_cells = combine([code_variable(frame, v, metadata) for v in cols], n)
    n_cols = len(col_cells.labels)
    if len(row_cells.labels) * n_cols > MAX_CELLS:
        raise AnalysisError(
            "too_many_cells", f"the table would have more than {MAX_CELLS} cells; use fewer levels"
        )
    inner = row_cells.codes * n_cols + col_cells.codes
    inner[(row_cells.codes < 0) | (col_cells.codes < 0)] = -1
    return row_cells, col_cells, inner


def _cell_names(row_cells: Cells, col_cells: Cells) -> list[str]:
    return [
        f"{label_text(r)} | {label_text(c)}" if c else label_text(r)
        for r in row_cells.labels
        for c in col_cells.labels
    ]


def _margin_maps(
    row_codes: np.ndarray, col_codes: np.ndarray, n_rows: int, n_cols: int, two_way: bool
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(record mask, output cell position) pairs for the inner cells and each kind of margin.

    Output layout is (n_rows + 1) x (n_cols + 1) for two-way tables, (n_rows + 1) x 1 otherwise.
    """
    width = n_cols + 1 if two_way else n_cols
    inside = (row_codes >= 0) & (col_codes >= 0)
    maps = [(inside, row_codes * width + col_codes)]
    if two_way:
        maps.append((inside, row_codes * width + n_cols))  # row totals (last column)
    maps.append((inside, n_rows * width + col_codes))  # column totals (last row)
    if two_way:
        maps.append((inside, np.full_like(row_codes, n_rows * width + n_cols)))
    return maps


def _grid(flat: list[object], n_rows: int, width: int) -> list[list[object]]:
    return [flat[r * width : (r + 1) * width] for r in range(n_rows)]


def frequency_table(
    analysis: FrequencyTable, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> TableOutput:
    """Counts of records by row x column level combinations."""
    require_columns(frame, analysis.rows + analysis.cols)
    row_cells, col_cells, inner = _layout(frame, analysis.rows, analysis.cols, metadata)
    n_rows, n_cols = len(row_cells.labels), len(col_cells.labels)
    two_way = bool(analysis.cols)
    out_rows = n_rows + 1 if analysis.margins else n_rows
    width = n_cols + 1 if analysis.margins and two_way else n_cols
    counts = np.zeros(out_rows * width, dtype=np.int64)
    if analysis.margins:
        for mask, pos in _margin_maps(row_cells.codes, col_cells.codes, n_rows, n_cols, two_way):
            counts += np.bincount(pos[mask], minlength=counts.size)
    else:
        counts += np.bincount(inner[inner >= 0], minlength=counts.size)
    grid = counts.reshape(out_rows, width)
    row_labels = list(row_cells.labels) + ([ALL] if analysis.margins else [])
    col_labels = list(col_cells.labels) + ([ALL] if analysis.margins and two_way else [])
    return TableOutput(
        source="frequency_table",
        statistic="count",
        row_vars=list(analysis.rows),
        col_vars=list(analysis.cols),
        row_labels=row_labels,
        col_labels=col_labels,
        values=[[float(v) for v in row] for row in grid],
        margins=analysis.margins,
        facts=TableFacts(
            cells=CellFacts(counts=grid.tolist()),
            query_set=query_set(_cell_names(row_cells, col_cells), frame, inner, n_records),
            n_total=int((inner >= 0).sum()),
        ),
    )


def _magnitude_cell_facts(
    cell: np.ndarray, values: np.ndarray, units: np.ndarray | None, size: int
) -> dict[str, list[object]]:
    """Facts for each of `size` output cells from the records' cell positions (-1 = none)."""
    in_cell = cell >= 0
    has_value = in_cell & ~np.isnan(values)
    counts = np.bincount(cell[has_value], minlength=size)
    missing = np.bincount(cell[in_cell & np.isnan(values)], minlength=size)
    totals = np.bincount(cell[has_value], weights=values[has_value], minlength=size)
    negative = np.zeros(size, dtype=bool)
    negative[np.unique(cell[has_value & (values < 0)])] = True
    frame = pd.DataFrame({"cell": cell[has_value], "value": values[has_value]})
    if units is not None:
        # Dominance is about contributor units (e.g. firms), so sum each unit's records first.
        frame["unit"] = units[has_value]
        frame = frame.groupby(["cell", "unit"], sort=False, as_index=False)["value"].sum()
        contributors = frame.groupby("cell")["unit"].nunique()
    top_values = (
        frame.sort_values("value", ascending=False, kind="stable")
        .groupby("cell", sort=False)
        .head(TOP_N)
    )
    top: list[list[float]] = [[] for _ in range(size)]
    for c, v in zip(top_values["cell"].to_numpy(), top_values["value"].to_numpy(), strict=True):
        top[int(c)].append(float(v))
    facts: dict[str, list[object]] = {
        "counts": [int(x) for x in counts],
        "missing": [int(x) for x in missing],
        "total": [float(x) for x in totals],
        "negative": [bool(x) for x in negative],
        "top": list(top),
    }
    if units is not None:
        per_cell = np.zeros(size, dtype=np.int64)
        per_cell[contributors.index.to_numpy(dtype=np.int64)] = contributors.to_numpy()
        facts["contributors"] = [int(x) for x in per_cell]
    return facts


def magnitude_table(
    analysis: MagnitudeTable, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> TableOutput:
    """Sum or mean of `value` by row x column level combinations, with dominance facts."""
    unit_col = metadata.contributor_column
    needed = [*analysis.rows, *analysis.cols, analysis.value]
    if unit_col is not None:
        needed.append(unit_col)
    require_columns(frame, needed)
    values = numeric_values(frame, analysis.value)
    units = frame[unit_col].astype(object).to_numpy() if unit_col is not None else None
    if units is not None:
        # A record whose unit is unknown still contributes; treat it as its own unit.
        unknown = pd.isna(units)
        units[unknown] = [f"\x00record{i}" for i in np.flatnonzero(unknown)]
    row_cells, col_cells, inner = _layout(frame, analysis.rows, analysis.cols, metadata)
    n_rows, n_cols = len(row_cells.labels), len(col_cells.labels)
    two_way = bool(analysis.cols)
    out_rows = n_rows + 1 if analysis.margins else n_rows
    width = n_cols + 1 if analysis.margins and two_way else n_cols
    size = out_rows * width
    if analysis.margins:
        maps = _margin_maps(row_cells.codes, col_cells.codes, n_rows, n_cols, two_way)
    else:
        maps = [(inner >= 0, inner)]
    merged: dict[str, list[object]] = {}
    for mask, pos in maps:
        cell = np.where(mask, pos, -1)
        part = _magnitude_cell_facts(cell, values, units, size)
        touched = set(np.unique(pos[mask]).tolist())
        for key, seq in part.items():
            target = merged.setdefault(key, list(seq))
            for i in touched:
                target[i] = seq[i]
    counts = merged["counts"]
    totals = merged["total"]
    stat: list[float | None] = []
    extra: dict[str, list[Any]] = {}
    if analysis.agg in ("std", "mode"):
        # Every record once per cell it counts in (body and margins): one pass over them all.
        spread, extra = cell_spread_and_mode(
            analysis.agg,
            np.concatenate([pos[mask] for mask, pos in maps]),
            np.concatenate([values[mask] for mask, _ in maps]),
            size,
            None if units is None else np.concatenate([units[mask] for mask, _ in maps]),
        )
        stat = [fnum(x) for x in spread]
    else:
        for i in range(size):
            n = int(counts[i])  # type: ignore[call-overload]
            total = float(totals[i])  # type: ignore[arg-type]
            stat.append(None if n == 0 else fnum(total if analysis.agg == "sum" else total / n))
    has_value = (inner >= 0) & ~np.isnan(values)
    cell_facts = CellFacts(
        counts=_grid(counts, out_rows, width),
        contributors=_grid(merged["contributors"], out_rows, width)
        if "contributors" in merged
        else None,
        top=_grid(merged["top"], out_rows, width),
        total=_grid(totals, out_rows, width),
        negative=_grid(merged["negative"], out_rows, width),
        missing=_grid(merged["missing"], out_rows, width),
        **{key: _grid(seq, out_rows, width) for key, seq in extra.items()},
    )
    return TableOutput(
        source="magnitude_table",
        statistic=analysis.agg,
        value=analysis.value,
        row_vars=list(analysis.rows),
        col_vars=list(analysis.cols),
        row_labels=list(row_cells.labels) + ([ALL] if analysis.margins else []),
        col_labels=list(col_cells.labels) + ([ALL] if analysis.margins and two_way else []),
        values=_grid(stat, out_rows, width),  # type: ignore[arg-type]
        margins=analysis.margins,
        facts=TableFacts(
            cells=cell_facts,
            query_set=query_set(
                _cell_names(row_cells, col_cells), frame, np.where(has_value, inner, -1), n_records
            ),
            n_total=int(has_value.sum()),
        ),
    )


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
    groups = combine([code_variable(frame, v, metadata) for v in analysis.by], len(frame))
    if len(groups.labels) * n_bins > MAX_CELLS:
        raise AnalysisError(
            "too_many_cells", f"the histogram would have more than {MAX_CELLS} cells"
        )
    cell = groups.codes * n_bins + bin_index
    cell[(groups.codes < 0) | (bin_index < 0)] = -1
    counts = np.bincount(cell[cell >= 0], minlength=len(groups.labels) * n_bins)
    grid = counts.reshape(len(groups.labels), n_bins)
    col_labels: list[list[Label]] = [
        [_bin_label(edges[i], edges[i + 1], i == n_bins - 1)] for i in range(n_bins)
    ]
    names = [
        f"{label_text(g)} | {c[0]}" if g else str(c[0]) for g in groups.labels for c in col_labels
    ]
    return TableOutput(
        source="histogram",
        statistic="count",
        value=analysis.variable,
        row_vars=list(analysis.by),
        col_vars=[analysis.variable],
        row_labels=groups.labels,
        col_labels=col_labels,
        values=[[float(v) for v in row] for row in grid],
        bin_edges=[float(e) for e in edges],
        facts=TableFacts(
            cells=CellFacts(counts=grid.tolist()),
            query_set=query_set(names, frame, cell, n_records),
            n_total=int((cell >= 0).sum()),
            # Edges computed from the data reveal its minimum and maximum; declared ones do not.
            bin_edges_from_data=analysis.edges is None,
        ),
    )
