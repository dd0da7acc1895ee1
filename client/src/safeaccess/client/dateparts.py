"""Parts of a date column a researcher groups by: `year(admitted)`, `month(admitted)`,
`day(admitted)`.

A table, a summary's `by`, a histogram's `by` or a DP answer's `by` may name a part of a date
column where it names a grouping column. The part is spelled as the formula grammar spells a
transform (`log(income)`): the function's name, then the column in parentheses. Its values are
integers, as pandas' `Series.dt.year` / `.dt.month` / `.dt.day` and DuckDB's `year()` /
`month()` / `day()` give them: the year, the month of the year (1-12) and the day of the month
(1-31). A year and a month together are `rows=["year(admitted)"], cols=["month(admitted)"]`.

The levels of a part come from the column's declared `date_bounds` alone (every year from the
first date's to the last's; the months and days of the month those dates span), so they are
public metadata like a categorical column's levels: every level is a cell, empty or not, and a
cell's existence says nothing about the data. A date column without declared bounds cannot be
grouped by its parts.
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Literal, get_args

DatePartName = Literal["year", "month", "day"]
#: The parts, in the order messages list them.
DATE_PARTS: tuple[str, ...] = get_args(DatePartName)

# Written exactly so (no spaces): the name is also the output's variable name and the key of
# the derived column in the runner's frame, so one part has one spelling.
_PATTERN = re.compile(r"^(year|month|day)\(([A-Za-z_][A-Za-z0-9_]*)\)$")
_LOOKS_LIKE_CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*$")


def parse_part(name: str) -> tuple[DatePartName, str] | None:
    """('year', 'admitted') for 'year(admitted)'; None for anything else (a plain column)."""
    found = _PATTERN.match(name)
    if found is None:
        return None
    part = found.group(1)
    assert part in DATE_PARTS
    return part, found.group(2)  # type: ignore[return-value]


def part_name(part: str, column: str) -> str:
    """The canonical spelling of a part: 'year(admitted)'."""
    return f"{part}({column})"


def looks_like_call(name: str) -> str | None:
    """The function name of something written as a call that is not a date part
    (`week(admitted)`, `log(age)`): for the one-line error that lists the parts."""
    found = _LOOKS_LIKE_CALL.match(name)
    return found.group(1) if found is not None and parse_part(name) is None else None


def part_levels(part: str, first: date, last: date) -> list[int]:
    """Every value `part` takes on the days from `first` to `last` (inclusive), ascending."""
    if part == "year":
        return list(range(first.year, last.year + 1))
    if part == "month":
        if (last.year - first.year) * 12 + last.month - first.month >= 11:
            return list(range(1, 13))
        months, y, m = [], first.year, first.month
        while (y, m) <= (last.year, last.month):
            months.append(m)
            y, m = (y + 1, 1) if m == 12 else (y, m + 1)
        return sorted(months)
    if part == "day":
        if (last - first).days >= 62:  # any 63 days hold every day of the month, 31 included
            return list(range(1, 32))
        days = {(first + timedelta(days=i)).day for i in range((last - first).days + 1)}
        return sorted(days)
    raise ValueError(f"unknown date part {part!r}; use one of {', '.join(DATE_PARTS)}")


def part_starts(part: str, first: date, last: date) -> list[date]:
    """The days inside (first, last] on which `part` changes value: where a grid of the
    calendar must be cut to tell every level apart (the query-set auditor's grid)."""
    out: list[date] = []
    if part == "year":
        out = [date(y, 1, 1) for y in range(first.year + 1, last.year + 1)]
    elif part == "month":
        y, m = first.year, first.month
        while True:
            y, m = (y + 1, 1) if m == 12 else (y, m + 1)
            start = date(y, m, 1)
            if start > last:
                break
            out.append(start)
    else:
        out = [first + timedelta(days=i) for i in range(1, (last - first).days + 1)]
    return out


__all__ = [
    "DATE_PARTS",
    "DatePartName",
    "looks_like_call",
    "parse_part",
    "part_levels",
    "part_name",
    "part_starts",
]
