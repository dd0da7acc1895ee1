"""Helpers shared by the compute modules: errors, levels of grouping variables, cells, numbers.

Record ids are positions in the stored dataset. Every compute function receives the *filtered*
frame whose index still holds those positions, plus `n_records`, the size of the stored dataset,
so that query sets can give every stored record a cell index (or -1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import Label, QuerySet
from safeaccess.rules.table_facts import label_text as label_text
from safeaccess.rules.tabulate import Coded as Coded
from safeaccess.rules.tabulate import TooManyCells, code_levels, declared_label, group_cells
from safeaccess.sandbox.runner.stored_codes import key_for

# The level rule lives with the one table builder in safeaccess.rules; the name stays here for
# the compute modules that label their groups with it.
to_label = declared_label

# A table or grouping with more cells than this is almost certainly a mistake (e.g. grouping by
# an identifier) and would only produce disclosive singleton cells; refuse it early.
MAX_CELLS = 100_000


class AnalysisError(Exception):
    """An analysis cannot be computed; `code` is machine-readable, the message is for the researcher.

    Messages name variables and analysis settings only, never data values.
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def require_columns(frame: pd.DataFrame, names: list[str]) -> None:
    """Raise AnalysisError('unknown_variable') if a variable is not in the dataset."""
    missing = [n for n in names if n not in frame.columns]
    if missing:
        raise AnalysisError(
            "unknown_variable",
            f"variable(s) {', '.join(missing)} not in the dataset; check the dataset metadata",
        )


def numeric_values(frame: pd.DataFrame, name: str) -> np.ndarray:
    """The column as float64 with NaN for missing; AnalysisError if it is not numeric."""
    column = frame[name]
    if pd.api.types.is_bool_dtype(column.dtype):
        return column.astype("float64").to_numpy()
    if isinstance(column.dtype, pd.CategoricalDtype) or column.dtype == object:
        # A categorical column of numbers (declared levels 0/1, say) is numeric wherever it is
        # stored as categories or Python objects: the same answer as for its int64 copy.
        values = column.cat.categories if isinstance(column.dtype, pd.CategoricalDtype) else column
        kind = pd.api.types.infer_dtype(values, skipna=True)
        if kind in ("integer", "floating", "mixed-integer-float", "boolean"):
            return (
                pd.to_numeric(column.astype(object), errors="raise")
                .astype("float64")
                .to_numpy(na_value=np.nan)
            )
    if not pd.api.types.is_numeric_dtype(column.dtype):
        raise AnalysisError(
            "not_numeric", f"variable {name} is not numeric; this analysis needs a numeric variable"
        )
    return column.astype("float64").to_numpy(na_value=np.nan)


def fnum(value: Any) -> float | None:
    """A finite float, or None for NaN/inf/None (JSON has no NaN)."""
    if value is None:
        return None
    out = float(value)
    return out if math.isfinite(out) else None


def code_variable(frame: pd.DataFrame, name: str, metadata: DatasetMetadata) -> Coded:
    """Code a grouping variable by its declared levels (`safeaccess.rules.tabulate.code_levels`).

    Declared levels (metadata, else the categories of a pandas Categorical) come first, in
    declared order, and are kept even when no record has them: empty cells matter for disclosure
    checks. Values not declared follow in sorted order. Missing values get code -1 (the record
    is in no cell).
    """
    codes, levels = code_levels(frame[name], declared_levels(metadata, name))
    return Coded(name=name, codes=codes, levels=levels)


def declared_levels(metadata: DatasetMetadata, name: str) -> list[Label] | None:
    """The levels the metadata declares for a column (None: none declared)."""
    declared = metadata.column(name)
    return list(declared.levels) if declared is not None and declared.levels else None


@dataclass(frozen=True)
class Cells:
    """The cartesian product of one or more coded variables: one cell per level combination."""

    labels: list[list[Label]]
    codes: np.ndarray  # cell index per record, -1 where any variable is missing
    levels: list[list[Label]]  # each variable's levels, in the given order


def too_many_groups(names: list[str], size: int) -> str:
    """The message refusing a grouping of `size` level combinations of `names`."""
    return (
        f"grouping by {', '.join(names)} gives {size} cells (limit {MAX_CELLS}); group by fewer "
        "or coarser variables"
    )


def group(frame: pd.DataFrame, names: list[str], metadata: DatasetMetadata) -> Cells:
    """Cells of the cartesian product of the variables `names` by their declared levels
    (row-major in the given order), placed by the one table builder
    (`safeaccess.rules.tabulate.group_cells`, on the dataset's stored codes where it has them).

    No variables give a single cell labelled [] holding every record.
    """
    keys = [key_for(frame, v, metadata) for v in names]
    try:
        levels, labels, codes = group_cells(
            keys,
            [declared_levels(metadata, v) for v in names],
            len(frame),
            max_cells=MAX_CELLS,
        )
    except TooManyCells as exc:
        raise AnalysisError("too_many_cells", too_many_groups(exc.names, exc.cells)) from None
    return Cells(labels=labels, codes=codes, levels=levels)


def query_set(labels: list[str], frame: pd.DataFrame, cell: np.ndarray, n_records: int) -> QuerySet:
    """QuerySet over all stored records: `cell` gives the index for each row of the filtered frame."""
    if isinstance(frame.index, pd.RangeIndex) and frame.index.equals(pd.RangeIndex(n_records)):
        return QuerySet.from_array(labels, cell)  # every stored record, in stored order
    index = np.full(n_records, -1, dtype=np.int64)
    positions = frame.index.to_numpy(dtype=np.int64)
    index[positions] = cell
    return QuerySet.from_array(labels, index)
