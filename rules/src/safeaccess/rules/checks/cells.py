"""Cells of table outputs, for the table-shaped checks and the checkers' pages: cell names, layouts
and located findings (public: `server/web/render.py` names cells with `cell_name`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from safeaccess.rules.decision import Finding, Verdict
from safeaccess.rules.outputs import Label, TableOutput


@dataclass(frozen=True)
class Located:
    """A finding with the (row, column) of the table cell it concerns, or None for the whole."""

    row: int | None
    col: int | None
    finding: Finding


def _fmt(label: Label) -> str:
    if isinstance(label, float) and label.is_integer():
        return str(int(label))
    return str(label)


def cell_name(output: TableOutput, i: int, j: int) -> str:
    """A researcher-readable name such as 'region=North, sex=F' (margins read 'All')."""
    parts: list[str] = []
    if i < len(output.row_labels):
        labels = output.row_labels[i]
        if labels == ["All"] and output.margins and i == len(output.row_labels) - 1:
            parts.append("all rows")
        else:
            parts += [f"{v}={_fmt(x)}" for v, x in zip(output.row_vars, labels, strict=False)]
    if j < len(output.col_labels) and output.col_labels[j]:
        labels = output.col_labels[j]
        if labels == ["All"] and output.margins and j == len(output.col_labels) - 1:
            parts.append("all columns")
        else:
            parts += [f"{v}={_fmt(x)}" for v, x in zip(output.col_vars, labels, strict=False)]
    return ", ".join(parts) or "total"


def matrix(rows: list[list[int]] | list[list[float]] | list[list[bool]], dtype: type) -> np.ndarray:
    """A facts matrix as a 2-D numpy array (an empty table becomes shape (0, 0))."""
    arr: np.ndarray = np.asarray(rows, dtype=dtype)
    return arr.reshape(len(rows), -1) if arr.ndim != 2 else arr


def released_mask(output: TableOutput) -> np.ndarray:
    """Cells the researcher would see: everything except cells marked suppressed."""
    shape = matrix(output.facts.cells.counts, np.int64).shape
    if output.suppressed is None:
        return np.ones(shape, dtype=bool)
    return ~matrix(output.suppressed, bool)


def interior_mask(output: TableOutput, shape: tuple[int, int]) -> np.ndarray:
    """True for body cells, False for the margin row/column of a table with margins."""
    inner = np.ones(shape, dtype=bool)
    if output.margins and shape[0] and shape[1]:
        if output.row_labels and output.row_labels[-1] == ["All"]:
            inner[-1, :] = False
        if output.col_labels and output.col_labels[-1] == ["All"]:
            inner[:, -1] = False
    return inner


def locate(
    output: TableOutput,
    mask: np.ndarray,
    check: str,
    verdict: Verdict,
    message: str,
    values: dict[str, np.ndarray] | None = None,
) -> list[Located]:
    """One finding per True cell of `mask`; `message` is formatted with the cell and `values`."""
    out: list[Located] = []
    rows, cols = np.nonzero(mask)
    for i, j in zip(rows.tolist(), cols.tolist(), strict=True):
        name = cell_name(output, i, j)
        fields = {k: _num(v[i, j]) for k, v in (values or {}).items()}
        out.append(
            Located(
                i,
                j,
                Finding(
                    check=check,
                    verdict=verdict,
                    item=name,
                    message=message.format(cell=name, **fields),
                ),
            )
        )
    return out


def _num(x: object) -> str:
    if isinstance(x, np.floating | float):
        return f"{float(x):.3g}"
    if isinstance(x, np.integer):
        return str(int(x))
    return str(x)
