"""The parts of date columns an analysis groups by (`year(admitted)`), as columns of the frame.

Validation lets a date part stand where a grouping column may (a table's rows and cols, a
`by`; `safeaccess.client.dateparts`); the compute modules read grouping columns from the frame
by name, so the runner adds each part the analysis names as a column of that name, computed
as pandas computes it (`Series.dt.year`, `.dt.month`, `.dt.day`; nullable integers, missing
where the date is). The DuckDB path computes the same in SQL (`duckdb_tables`). A date column
stored as 'YYYY-MM-DD' text (a Parquet file registered with storage "duckdb" before dates were
stored as dates) is read as dates first.
"""

from __future__ import annotations

import pandas as pd

from safeaccess.client.analyses import Analysis
from safeaccess.client.dateparts import parse_part

# The analysis fields that group records, and so may name a date part.
GROUPING_FIELDS = ("rows", "cols", "by")


def part_names(analysis: Analysis) -> list[str]:
    """The date parts `analysis` groups by, in the order it names them, each once."""
    found: list[str] = []
    for field in GROUPING_FIELDS:
        value = getattr(analysis, field, None)
        names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        for name in names:
            if isinstance(name, str) and parse_part(name) is not None and name not in found:
                found.append(name)
    return found


def as_dates(series: pd.Series) -> pd.Series:
    """A date column as datetime64 (NaT where missing or not a 'YYYY-MM-DD' date)."""
    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        return series
    return pd.to_datetime(series.astype("string"), format="%Y-%m-%d", errors="coerce")


def part_values(series: pd.Series, part: str) -> pd.Series:
    """`part` ('year', 'month' or 'day') of each date, as nullable integers."""
    dates = as_dates(series).dt
    values = dates.year if part == "year" else dates.month if part == "month" else dates.day
    return values.astype("Int64")


def with_date_parts(frame: pd.DataFrame, analysis: Analysis) -> pd.DataFrame:
    """`frame` with a column for each date part `analysis` groups by (the same frame when it
    names none; never modified: the parts are added to a new frame sharing its columns)."""
    names = part_names(analysis)
    if not names:
        return frame
    data = {c: frame[c] for c in frame.columns}
    for name in names:
        parsed = parse_part(name)
        assert parsed is not None
        part, base = parsed
        if base in frame.columns:  # an unknown column is refused by the compute module
            data[name] = part_values(frame[base], part)
    return pd.DataFrame(data, index=frame.index, copy=False)


__all__ = ["GROUPING_FIELDS", "as_dates", "part_names", "part_values", "with_date_parts"]
