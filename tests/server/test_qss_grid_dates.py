"""The QSS grid places records in every level of a date part a step groups or filters by.

The grid re-runs each output on points built from the metadata; a table by `month(admitted)`
has a cell per month of the declared date_bounds, so the grid needs a day in each of them (else
those cells have no point and the check falls back to comparing filters alone)."""

from __future__ import annotations

from datetime import date

from safeaccess.client.metadata import Column
from safeaccess.server.qss import grid

ADMITTED = Column(name="admitted", type="date", date_bounds=(date(2019, 3, 15), date(2020, 2, 10)))


def _months(points: list[str]) -> set[tuple[int, int]]:
    return {(date.fromisoformat(p).year, date.fromisoformat(p).month) for p in points}


def test_a_month_grouping_gets_a_point_in_every_month_of_the_bounds() -> None:
    months = _months(grid._points(ADMITTED, set(), set(), {"month"}))
    expected = {(2019, m) for m in range(3, 13)} | {(2020, 1), (2020, 2)}
    assert months == expected
    plain = _months(grid._points(ADMITTED, set(), set()))
    assert len(plain) < len(expected)  # without the part, far fewer pieces of the calendar


def test_a_day_grouping_gets_every_day_and_parts_are_found_in_rows_and_filters() -> None:
    days = grid._points(ADMITTED, set(), set(), {"day"})
    assert len(days) == (date(2020, 2, 10) - date(2019, 3, 15)).days + 1
    analyses = [
        {"kind": "frequency_table", "rows": ["year(admitted)"], "cols": [], "where": None},
        {"kind": "frequency_table", "rows": ["sex"], "where": "month(admitted) <= 6"},
    ]
    assert grid._date_parts(analyses) == {"admitted": {"year", "month"}}
