"""What a `where` filter tells about each selected record's value of a summarised variable.

`income between 30000 and 30150` pins every selected record's income to that band; in
`age == 97 or income between 30000 and 30150` it pins only the records that are not 97, and
says nothing about the one who is. A reconstruction check that assumed only the declared
bounds would miss how tightly the released mean fixes that one record's value.

Done here, in the sandbox, because the answer is per record: it depends on the record's other
columns (its age above), which only the sandbox sees. For each record the filter is a function
of the summarised value y alone (the other columns fixed), and it is constant between the
numeric constants the filter compares y with. So the filter is evaluated, by the same code that
selected the records (`safeaccess.sandbox.runner.filters.row_mask`, SQL null semantics included), once
per region: each constant, and a point inside each open interval between and beyond them. The
hull of the regions where it holds is what the filter implies about the record's value; cut to
the declared bounds, it is sound (every value the filter allows lies inside) and never tighter
than the filter's own logic.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pandas as pd

from safeaccess.client.grammar import (
    And,
    Between,
    Compare,
    Filter,
    In,
    IsNull,
    Not,
    Or,
    filter_columns,
    parse_filter,
)
from safeaccess.rules.outputs import BoundClass
from safeaccess.sandbox.runner.filters import row_mask


def _constants(node: Filter, column: str) -> set[float]:
    """Numeric literals the filter compares `column` with."""
    if isinstance(node, Compare):
        values: tuple[object, ...] = (node.value,) if node.column == column else ()
    elif isinstance(node, In):
        values = node.values if node.column == column else ()
    elif isinstance(node, Between):
        values = (node.low, node.high) if node.column == column else ()
    elif isinstance(node, IsNull):
        values = ()
    elif isinstance(node, Not):
        return _constants(node.operand, column)
    elif isinstance(node, And | Or):
        out: set[float] = set()
        for operand in node.operands:
            out |= _constants(operand, column)
        return out
    else:
        return set()
    return {
        float(v)
        for v in values
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))
    }


def _regions(constants: list[float]) -> list[tuple[float, float, float]]:
    """(representative, left end, right end) of every region, ascending."""
    out: list[tuple[float, float, float]] = []
    first, last = constants[0], constants[-1]
    out.append((first - 1.0 - abs(first), -math.inf, first))
    for a, b in pairwise(constants):
        out.append((a, a, a))
        out.append(((a + b) / 2.0, a, b))
    out.append((last, last, last))
    out.append((last + 1.0 + abs(last), last, math.inf))
    return out


def record_bounds(
    where: str | None,
    frame: pd.DataFrame,
    column: str,
    declared: tuple[float, float] | None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Per record of `frame` (the records the filter selected), the (low, high) the filter and
    the declared bounds confine `column` to; -inf/inf where nothing bounds it. None when the
    filter does not compare `column` with a number (then only the declared bounds apply)."""
    if where is None or not where.strip() or column not in frame.columns:
        return None
    node = parse_filter(where)
    constants = sorted(_constants(node, column))
    if not constants or not pd.api.types.is_numeric_dtype(frame[column].dtype):
        return None
    # only the columns the filter reads, with the summarised one replaced region by region
    probe = frame[sorted(filter_columns(node))].copy()
    probe[column] = probe[column].astype(np.float64)
    n = len(frame)
    low = np.full(n, math.inf)
    high = np.full(n, -math.inf)
    for value, left, right in _regions(constants):
        probe[column] = value
        holds = row_mask(probe, node)
        low = np.where(holds & (low == math.inf), left, low)  # first region that holds
        high = np.where(holds, right, high)  # last region that holds
    if declared is not None:
        low = np.maximum(low, declared[0])
        high = np.minimum(high, declared[1])
    return low, high


def bound_classes(low: np.ndarray, high: np.ndarray) -> list[BoundClass]:
    """Records grouped by equal (low, high), ascending; infinite ends become None."""
    if low.size == 0:
        return []
    pairs, counts = np.unique(np.stack([low, high], axis=1), axis=0, return_counts=True)
    return [
        BoundClass(
            low=None if math.isinf(lo) else float(lo),
            high=None if math.isinf(hi) else float(hi),
            count=int(c),
        )
        for (lo, hi), c in zip(pairs, counts, strict=True)
    ]
