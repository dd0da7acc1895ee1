"""The levels of a date part are the values pandas gives on every day of the declared bounds."""

from __future__ import annotations

from datetime import date, timedelta

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from safeaccess.client.dateparts import parse_part, part_levels, part_starts
from safeaccess.client.metadata import DatasetMetadata

DAYS = st.dates(min_value=date(1990, 1, 1), max_value=date(2030, 12, 31))


@settings(max_examples=60, deadline=None)
@given(first=DAYS, span=st.integers(min_value=0, max_value=800))
def test_levels_are_the_parts_of_every_day_in_the_bounds(first: date, span: int) -> None:
    last = first + timedelta(days=span)
    days = pd.Series(pd.date_range(first, last, freq="D"))
    for part in ("year", "month", "day"):
        expected = sorted(set(getattr(days.dt, part)))
        assert part_levels(part, first, last) == expected
        # each level begins on a start (or on the first day): the QSS grid's cuts
        starts = {first, *part_starts(part, first, last)}
        assert sorted({getattr(d, part) for d in starts}) == expected


def test_only_the_exact_spelling_of_a_bounded_date_is_a_part() -> None:
    assert parse_part("year(admitted)") == ("year", "admitted")
    for name in ("year( admitted)", "Year(admitted)", "week(admitted)", "year(a b)", "admitted"):
        assert parse_part(name) is None
    meta = DatasetMetadata.model_validate(
        {
            "name": "d",
            "columns": [
                {"name": "admitted", "type": "date", "date_bounds": ["2019-11-20", "2020-02-03"]},
                {"name": "born", "type": "date"},
                {"name": "age", "type": "integer"},
            ],
        }
    )
    month = meta.column("month(admitted)")
    assert month is not None and month.type == "ordinal" and month.levels == [1, 2, 11, 12]
    assert meta.column("year(born)") is None  # no bounds: no levels to group by
    assert meta.column("year(age)") is None


@pytest.mark.parametrize("part", ["year", "month", "day"])
def test_a_single_day_has_one_level(part: str) -> None:
    d = date(2024, 2, 29)
    assert part_levels(part, d, d) == [getattr(d, part)]
