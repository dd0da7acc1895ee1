"""What a `where` filter tells about each selected record's value, per record and soundly."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from safeaccess.sandbox.runner.compute.bounds import bound_classes, record_bounds
from safeaccess.sandbox.runner.filters import row_mask

FRAME = pd.DataFrame(
    {
        "age": [97, 40, 41, 50, np.nan],
        "income": [81234.0, 30000.0, 30150.0, 30075.0, 30010.0],
    }
)
DECLARED = (0.0, 1e6)


def _bounds(where: str, frame: pd.DataFrame = FRAME) -> list[tuple[float, float]]:
    selected = frame.loc[row_mask(frame, where)].reset_index(drop=True)
    found = record_bounds(where, selected, "income", DECLARED)
    assert found is not None
    return list(zip(found[0].tolist(), found[1].tolist(), strict=True))


def test_a_band_bounds_every_record() -> None:
    assert _bounds("income between 30000 and 30150") == [(30000.0, 30150.0)] * 4


def test_a_disjunction_bounds_only_its_branch() -> None:
    # the 97-year-old passes by age: the filter says nothing about her income; the others
    # (and the record whose age is missing: 'age == 97' is unknown there) by the band only
    where = "age == 97 or income between 30000 and 30150"
    assert _bounds(where) == [DECLARED] + [(30000.0, 30150.0)] * 4


def test_negation_and_one_sided_comparisons() -> None:
    # records 81234 and 30150 pass; for both the filter means income >= 30100
    assert _bounds("not (income < 30100)") == [(30100.0, 1e6)] * 2
    # (40, 30000) and (50, 30075) pass; the record without an age is unknown, so not selected
    assert _bounds("income <= 30075 and age < 60") == [(0.0, 30075.0)] * 2


def test_in_list_and_conjunction_with_other_columns() -> None:
    assert _bounds("income in (30000, 30150) and age > 10") == [(30000.0, 30150.0)] * 2


def test_no_comparison_with_the_variable_gives_nothing() -> None:
    assert record_bounds("age > 45", FRAME, "income", DECLARED) is None
    assert record_bounds(None, FRAME, "income", DECLARED) is None


@pytest.mark.parametrize(
    "where",
    [
        "age == 97 or income between 30000 and 30150",
        "not (income between 30010 and 30100) or age > 45",
        "(income > 30000 and age < 45) or income < 30010",
        "income != 30075 and not (age in (41, 50))",
    ],
)
def test_every_value_the_filter_allows_lies_inside(where: str) -> None:
    # soundness: move each selected record's income over a fine grid; wherever the filter still
    # holds for that record, the value must lie inside its bounds
    selected = FRAME.loc[row_mask(FRAME, where)].reset_index(drop=True)
    found = record_bounds(where, selected, "income", DECLARED)
    assert found is not None
    low, high, part_low, part_high = found
    # each record's part holds its own value and lies inside the hull
    own = selected["income"].to_numpy()
    assert np.all((part_low <= own) & (own <= part_high))
    assert np.all((low <= part_low) & (part_high <= high))
    for value in np.linspace(29_000.0, 31_000.0, 401):
        probe = selected.copy()
        probe["income"] = value
        holds = row_mask(probe, where)
        assert np.all(~holds | ((low <= value) & (value <= high)))


def test_bound_classes_group_equal_intervals() -> None:
    low = np.array([0.0, 30000.0, 30000.0, -math.inf])
    high = np.array([1e6, 30150.0, 30150.0, math.inf])
    classes = bound_classes(low, high)
    assert [(c.low, c.high, c.count) for c in classes] == [
        (None, None, 1),
        (0.0, 1e6, 1),
        (30000.0, 30150.0, 2),
    ]


def _parts(where: str, frame: pd.DataFrame) -> list[tuple[float, float, float, float]]:
    selected = frame.loc[row_mask(frame, where)].reset_index(drop=True)
    found = record_bounds(where, selected, "income", DECLARED)
    assert found is not None
    return list(zip(*(a.tolist() for a in found), strict=True))


def test_separate_intervals_give_each_record_the_part_that_holds_its_value() -> None:
    # issue 41: `... or income == 150000` made the hull 30 000..150 000 and freed the companions
    frame = pd.DataFrame({"age": [97, 40, 41], "income": [81234.0, 30075.0, 150000.0]})
    where = "age == 97 or income between 30000 and 30150 or income == 150000"
    assert _parts(where, frame) == [
        (0.0, 1e6, 0.0, 1e6),  # the target: the filter holds whatever her income
        (30000.0, 150000.0, 30000.0, 30150.0),
        (30000.0, 150000.0, 150000.0, 150000.0),
    ]
    # an in list pins each record to its own value
    assert [p[2:] for p in _parts("income in (30075, 150000)", frame)] == [
        (30075.0, 30075.0),
        (150000.0, 150000.0),
    ]


def test_a_lone_excluded_point_does_not_split_a_part() -> None:
    # `income != 30075` fails only at a point: the record is still anywhere but there
    assert _parts("income != 30075", FRAME) == [(0.0, 1e6, 0.0, 1e6)] * 4
