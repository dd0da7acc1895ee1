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
run of adjacent regions where it holds that contains the record's own value is what the check
takes the filter to imply about it, cut to the declared bounds. That is the filter's own
logic when it allows one interval; when it allows several (`income between 30000 and 30150 or
income == 150000`) it credits the attacker with knowing which one each record is in, which
only makes the check stricter: the ranges it derives are never wider than an attacker's.
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


#: Per selected record: the hull's (low, high), then the part's (low, high) (`record_bounds`).
RecordBounds = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def record_bounds(
    where: str | None,
    frame: pd.DataFrame,
    column: str,
    declared: tuple[float, float] | None,
) -> RecordBounds | None:
    """Per record of `frame` (the records the filter selected), the (low, high) the filter and
    the declared bounds confine `column` to (the hull), and the (low, high) of the part of it
    that holds the record's own value; -inf/inf where nothing bounds it. None when the filter
    does not compare `column` with a number (then only the declared bounds apply).

    The part: where the filter allows separate intervals (`income between 30000 and 30150 or
    income == 150000`), the run of them around the record's value (the filter failing at a
    lone point, as `income != 30075` does, does not split a run). The check credits the *other*
    records of a group with knowing their part, which only narrows the ranges it derives (the
    hull of 30 000 to 150 000 left the companions free enough that a mean and sd fixing an
    outsider's income were released), and keeps the hull as the record's own prior."""
    if where is None or not where.strip() or column not in frame.columns:
        return None
    node = parse_filter(where)
    constants = sorted(_constants(node, column))
    if not constants or not pd.api.types.is_numeric_dtype(frame[column].dtype):
        return None
    # only the columns the filter reads, with the summarised one replaced region by region
    probe = frame[sorted(filter_columns(node))].copy()
    actual = probe[column].to_numpy(dtype=np.float64, na_value=np.nan)
    probe[column] = actual
    n = len(frame)
    # the region of each record's own value (`_regions`: constant j is region 2j + 1, the open
    # interval below it region 2j); -1 for a missing value
    cuts = np.asarray(constants, dtype=np.float64)
    j = np.searchsorted(cuts, actual, side="left")
    on_constant = (j < cuts.size) & (cuts[np.minimum(j, cuts.size - 1)] == actual)
    own = np.where(np.isnan(actual), -1, 2 * j + on_constant)
    low = np.full(n, math.inf)
    high = np.full(n, -math.inf)
    run = np.full(n, math.inf)  # left end of the current run of holding regions
    part_low = np.full(n, math.inf)
    part_high = np.full(n, -math.inf)
    following = np.zeros(n, dtype=bool)  # in the run that holds the record's own value
    for index, (value, left, right) in enumerate(_regions(constants)):
        probe[column] = value
        holds = row_mask(probe, node)
        low = np.where(holds & (low == math.inf), left, low)  # first region that holds
        high = np.where(holds, right, high)  # last region that holds
        # only an interval of positive width where the filter fails ends a run
        ends = ~holds if index % 2 == 0 else np.zeros(n, dtype=bool)
        run = np.where(ends, math.inf, np.where(holds & (run == math.inf), left, run))
        reached = holds & (own == index)
        part_low = np.where(reached, run, part_low)
        following = (following | reached) & ~ends
        part_high = np.where(following & holds, right, part_high)
    missing = part_low == math.inf  # no own value (or it fails the filter): the hull
    part_low = np.where(missing, low, part_low)
    part_high = np.where(missing, high, part_high)
    if declared is not None:
        low, part_low = np.maximum(low, declared[0]), np.maximum(part_low, declared[0])
        high, part_high = np.minimum(high, declared[1]), np.minimum(part_high, declared[1])
    return low, high, part_low, part_high


def bound_classes(
    low: np.ndarray,
    high: np.ndarray,
    part_low: np.ndarray | None = None,
    part_high: np.ndarray | None = None,
) -> list[BoundClass]:
    """Records grouped by equal (low, high) and part, ascending; infinite ends become None."""
    if low.size == 0:
        return []
    part_low = low if part_low is None else part_low
    part_high = high if part_high is None else part_high
    rows, counts = np.unique(
        np.stack([low, high, part_low, part_high], axis=1), axis=0, return_counts=True
    )

    def end(x: float) -> float | None:
        return None if math.isinf(x) else float(x)

    return [
        BoundClass(
            low=end(lo),
            high=end(hi),
            count=int(c),
            part=None if (p_lo, p_hi) == (lo, hi) else (end(p_lo), end(p_hi)),
        )
        for (lo, hi, p_lo, p_hi), c in zip(rows, counts, strict=True)
    ]
