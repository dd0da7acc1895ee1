"""The facts of a table, described once for every path that computes a table.

Two paths count and sum a table's cells, each its own way: `rules.tabulate` over columns in
memory (numpy `bincount`: the researcher's `crosstab` / `pivot_table` and the sandbox's
in-memory tables) and the sandbox's DuckDB path over a Parquet file too large to load
(`sandbox/runner/duckdb_tables.py`, SQL `GROUP BY`). Both hand their per-cell results here, and
this module alone decides what a table's facts are: where the margins go (a last row "All" and,
for a table with column variables, a last column), which facts each kind of table carries
(counts; for a magnitude table also totals, records lacking a value, negatives and the largest
contributions), how a margin's largest contributions follow from its cells', what the released
values are for each statistic, `n_total`, and the names of the query set's cells. So the checks
see the same `TableOutput` whichever path computed it (`tests/sandbox/test_duckdb_tables.py`
compares the two paths' replies byte for byte for every table kind the DuckDB path computes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from safeaccess.rules.outputs import CellFacts, Label, TableFacts, TableOutput

#: Largest contributions kept per cell (the dominance rules read at most three).
TOP_N = 3
Source = Literal["frequency_table", "magnitude_table", "histogram", "contingency"]
Statistic = Literal["count", "sum", "mean", "std", "mode"]


class Layout:
    """Where body cells and margins go in the released grid."""

    def __init__(self, nr: int, nc: int, margins: bool, two_way: bool) -> None:
        self.nr, self.nc, self.margins, self.two_way = nr, nc, margins, two_way
        self.height = nr + 1 if margins else nr
        self.width = nc + 1 if margins and two_way else nc

    def grid(self, body: np.ndarray, row: Any = None, col: Any = None, corner: Any = None) -> Any:
        """The (height, width[, k]) grid from the body (one entry, or k, per cell, row-major)
        and its margins: row totals (nr[, k]), column totals (nc[, k]) and the grand total."""
        body = body.reshape(self.nr, self.nc, *body.shape[1:])
        if not self.margins:
            return body
        out = np.zeros((self.height, self.width, *body.shape[2:]), dtype=body.dtype)
        out[: self.nr, : self.nc] = body
        if self.two_way:
            out[: self.nr, self.nc] = row
            out[self.nr, : self.nc] = col
            out[self.nr, self.nc] = corner
        else:  # one column: its total is the grand total
            out[self.nr, 0] = corner
        return out

    def added(self, body: np.ndarray) -> Any:
        """The grid of an integer (summed) or boolean (any) fact, margins from the body."""
        b = body.reshape(self.nr, self.nc)
        if body.dtype == bool:
            return self.grid(body, b.any(axis=1), b.any(axis=0), b.any())
        return self.grid(body, b.sum(axis=1), b.sum(axis=0), b.sum())

    def largest(self, tops: np.ndarray) -> Any:
        """The (height, width, 3) grid of largest contributions from the body cells' (ncells, 3)
        -inf-padded ones: a record lies in one cell, so a margin's largest are among its cells'
        (not so for per-unit totals, whose margins the caller computes)."""
        if not self.margins:
            return self.grid(tops)
        shaped = tops.reshape(self.nr, self.nc, TOP_N)
        row = merge_largest(shaped, axis=1)
        col = merge_largest(shaped, axis=0)
        corner = merge_largest(row[None, :, :], axis=1)[0]
        return self.grid(tops, row, col, corner)


def merge_largest(tops: np.ndarray, axis: int) -> np.ndarray:
    """Top three along `axis` of -inf-padded top threes (the last axis holds the three)."""
    moved = np.moveaxis(tops, axis, -2)  # (..., cells along axis, 3)
    flat = moved.reshape(*moved.shape[:-2], -1)
    return -np.sort(-flat, axis=-1)[..., :TOP_N]


def top_lists(tops: np.ndarray) -> list[list[list[float]]]:
    """Nested lists of a (rows, cols, 3) -inf-padded array, each cell's list cut at its padding:
    a cell with one contribution lists one value (a zero would be a contribution nobody made)."""
    return [[[x for x in cell if x != -np.inf] for cell in row] for row in tops.tolist()]


def label_text(labels: list[Label]) -> str:
    """A human name of a cell/group label tuple."""
    return ", ".join("(missing)" if v is None else str(v) for v in labels) or "all"


def cell_names(row_labels: list[list[Label]], col_labels: list[list[Label]]) -> list[str]:
    """The query set's name of every body cell, row-major: "row | column"."""
    return [
        " | ".join(label_text(part) for part in (r, c) if part) or "all"
        for r in row_labels
        for c in col_labels
    ]


@dataclass(frozen=True)
class TableShape:
    """What a table is laid out by: its variables, the labels of its body rows and columns (the
    margins' "All" is added here), and whether it has margins."""

    source: Source
    row_vars: list[str]
    col_vars: list[str]
    row_labels: list[list[Label]]
    col_labels: list[list[Label]]
    margins: bool
    #: A table of one column variable or more: margins add a column as well as a row.
    two_way: bool
    value: str | None = None

    @property
    def layout(self) -> Layout:
        return Layout(len(self.row_labels), len(self.col_labels), self.margins, self.two_way)


@dataclass(frozen=True)
class CellSums:
    """A magnitude table's per-cell results as a path computed them: body arrays row-major
    (ncells), grids laid out with their margins by `TableShape.layout`."""

    #: Records with a key in every variable and a value, per body cell.
    counts: np.ndarray
    #: Sum of the values, laid out (a margin's total summed over its records, not its cells).
    total: np.ndarray
    #: Records whose value is missing, per body cell.
    missing: np.ndarray
    #: Whether a value below zero is in the cell, per body cell.
    negative: np.ndarray
    #: The largest contributions, (height, width, 3) -inf-padded (`Layout.largest`).
    top: np.ndarray
    #: Distinct contributor units, laid out (None: no contributor variable).
    contributors: np.ndarray | None = None


def _released(grid: np.ndarray) -> list[list[float | None]]:
    return [[x if math.isfinite(x) else None for x in row] for row in grid.tolist()]


def _output(
    shape: TableShape,
    statistic: Statistic,
    values: np.ndarray,
    cells: CellFacts,
    n_total: int,
) -> TableOutput:
    rows, cols = list(shape.row_labels), list(shape.col_labels)
    if shape.margins:
        rows.append(["All"])
        if shape.two_way:
            cols.append(["All"])
    return TableOutput(
        source=shape.source,
        statistic=statistic,
        value=shape.value,
        row_vars=list(shape.row_vars),
        col_vars=list(shape.col_vars),
        row_labels=rows,
        col_labels=cols,
        values=_released(values),
        margins=shape.margins,
        facts=TableFacts(cells=cells, n_total=n_total),
    )


def count_table(shape: TableShape, body_counts: np.ndarray) -> TableOutput:
    """A frequency table or histogram from its records per body cell (row-major)."""
    counts = shape.layout.added(body_counts)
    cells = CellFacts(counts=counts.tolist())
    return _output(shape, "count", counts.astype(float), cells, int(body_counts.sum()))


def magnitude_table(
    shape: TableShape,
    statistic: Literal["sum", "mean", "std", "mode"],
    sums: CellSums,
    spread: tuple[np.ndarray, dict[str, Any]] | None = None,
) -> TableOutput:
    """A magnitude table from its cells' sums. A sum or mean follows from them; a std or mode
    table passes its value grid and its own facts (`facts.cell_spread_and_mode`) as `spread`,
    since neither adds up from its cells."""
    lay = shape.layout
    counts = lay.added(sums.counts)
    more: dict[str, Any] = {}
    if sums.contributors is not None:
        more["contributors"] = sums.contributors.tolist()
    if spread is not None:
        values, extra = spread
        more.update(extra)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            quotient = sums.total if statistic == "sum" else sums.total / counts
            values = np.where(counts > 0, quotient, np.nan)
    cells = CellFacts(
        counts=counts.tolist(),
        total=sums.total.tolist(),
        missing=lay.added(sums.missing).tolist(),
        negative=lay.added(sums.negative).tolist(),
        top=top_lists(sums.top),
        **more,
    )
    return _output(shape, statistic, values, cells, int(sums.counts.sum()))
