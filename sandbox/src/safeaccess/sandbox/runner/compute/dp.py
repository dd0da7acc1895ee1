"""Differentially private kinds: the exact statistic, clipped to the declared bounds.

The runner never sees noise or budget. It computes, over every declared group (empty ones give
zeros), the components `safeaccess.client.dpquery.layout` names, with

- records whose grouping value is missing or not a declared level in no group (dropped), so the
  answer's shape never depends on the data;
- numeric values clipped to the column's declared bounds; a record whose value is missing is
  left out of the statistic and counted in its group's `missing` component (a mean of several
  variables uses the records where all of them are present, as a regression does; so does the
  mean test, whose answer has no `missing` component);
- under the contributor-unit relation, at most `max_records_per_unit` records of each unit (the
  first in stored order; a record without a unit is a unit of its own).

Nothing here raises on a property of the data: an empty selection answers zeros like any other.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from safeaccess.client.analyses import DPCount, DPHistogram, DPMean, DPMeanTest, DPSum
from safeaccess.client.dpquery import Layout, LayoutError, group_levels, layout
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import DPStatisticFacts, DPStatisticOutput
from safeaccess.sandbox.runner.compute._common import (
    AnalysisError,
    numeric_values,
    require_columns,
    to_label,
)

DPQuery = DPCount | DPSum | DPMean | DPHistogram | DPMeanTest


def limit_units(frame: pd.DataFrame, metadata: DatasetMetadata) -> pd.DataFrame:
    """Keep at most the declared number of records per contributor unit (first in stored order)."""
    relation = metadata.neighbours
    unit = metadata.contributor_column
    if relation.unit != "contributor" or unit is None:
        return frame
    require_columns(frame, [unit])
    ids = frame[unit]
    has_unit = ids.notna().to_numpy()
    rank = np.zeros(len(frame), dtype=np.int64)
    if has_unit.any():
        rank[has_unit] = ids[has_unit].groupby(ids[has_unit], sort=False).cumcount().to_numpy()
    return frame.loc[rank < relation.max_records_per_unit]


def _level_index(value: Any, lookup: dict[Any, int]) -> int:
    if value is None or (isinstance(value, float) and value != value):
        return -1
    label = to_label(value)
    found = lookup.get(label)
    return found if found is not None else lookup.get(str(label), -1)


def _group_codes(frame: pd.DataFrame, shape: Layout, metadata: DatasetMetadata) -> np.ndarray:
    """Group index of each record in the declared level product (row-major), -1 for none."""
    n = len(frame)
    codes = np.zeros(n, dtype=np.int64)
    inside = np.ones(n, dtype=bool)
    for name in shape.by:
        levels = group_levels(metadata, [name])
        lookup: dict[Any, int] = {}
        for j, (level,) in enumerate(levels):
            lookup.setdefault(level, j)
            lookup.setdefault(str(level), j)
        column = frame[name].astype(object).to_numpy()
        mapped = np.fromiter((_level_index(v, lookup) for v in column), dtype=np.int64, count=n)
        inside &= mapped >= 0
        codes = codes * len(levels) + np.maximum(mapped, 0)
    codes[~inside] = -1
    return codes


def _clipped(frame: pd.DataFrame, name: str, metadata: DatasetMetadata) -> np.ndarray:
    col = metadata.column(name)
    if col is None or col.bounds is None:
        raise AnalysisError("bad_analysis", f"column {name} has no declared bounds")
    values = numeric_values(frame, name)
    return np.clip(values, col.bounds[0], col.bounds[1])


def dp_statistic(
    analysis: DPQuery, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> DPStatisticOutput:
    """The exact clipped statistic of a DP analysis over every declared group."""
    try:
        shape = layout(analysis, metadata)
    except LayoutError as exc:
        raise AnalysisError("bad_analysis", str(exc)) from exc
    require_columns(frame, list(shape.by))
    frame = limit_units(frame, metadata)
    groups = _group_codes(frame, shape, metadata)
    n_groups, k = len(shape.groups), len(shape.components)
    values = np.zeros((n_groups, k), dtype=np.float64)
    second: list[list[list[float]]] | None = None
    keep = groups >= 0
    g = groups[keep]
    if isinstance(analysis, DPCount):
        values[:, 0] = np.bincount(g, minlength=n_groups)
    elif isinstance(analysis, DPSum):
        x = _clipped(frame, analysis.variable, metadata)[keep]
        present = np.isfinite(x)
        values[:, 0] = np.bincount(g[present], weights=x[present], minlength=n_groups)
        values[:, 1] = np.bincount(g[~present], minlength=n_groups)
    elif isinstance(analysis, DPMean | DPMeanTest):
        columns = [
            _clipped(frame, name, metadata)[keep] - shape.centres[j]
            for j, name in enumerate(analysis.variables)
        ]
        z = np.column_stack(columns)
        complete = np.isfinite(z).all(axis=1)
        gc, zc = g[complete], z[complete]
        d = len(analysis.variables)
        for j in range(d):
            values[:, j] = np.bincount(gc, weights=zc[:, j], minlength=n_groups)
        values[:, d] = np.bincount(gc, minlength=n_groups)
        if isinstance(analysis, DPMean):
            values[:, d + 1] = np.bincount(g[~complete], minlength=n_groups)
        else:
            second = [(zc[gc == i].T @ zc[gc == i]).tolist() for i in range(n_groups)]
    else:
        assert isinstance(analysis, DPHistogram)
        x = _clipped(frame, analysis.variable, metadata)[keep]
        edges = np.asarray(analysis.edges, dtype=np.float64)
        present = np.isfinite(x)
        # Present values outside the declared edges are in no bin (the edges are the question).
        inside = present & (x >= edges[0]) & (x <= edges[-1])
        bins = np.searchsorted(edges, x[inside], side="right") - 1
        bins = np.minimum(bins, len(edges) - 2)  # the last bin is closed on the right
        flat = np.concatenate([g[inside] * k + bins, g[~present] * k + (k - 1)])
        values[:, :] = np.bincount(flat, minlength=n_groups * k).reshape(n_groups, k)
    return DPStatisticOutput(
        kind=analysis.kind,
        by=shape.by,
        groups=shape.groups,
        components=shape.components,
        facts=DPStatisticFacts(values=values.tolist(), second_moments=second, n_total=n_records),
    )
