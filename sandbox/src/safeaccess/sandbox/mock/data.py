"""A mock dataset built from published metadata alone, for rehearsing a plan.

Every value is drawn independently and uniformly from what the metadata declares: a categorical
or ordinal column from its levels, a numeric column between its bounds (or on its scale), an
identifier as a running number. So the mock has the real columns, types, levels and (up to a cap)
row count, and nothing else: no relationship between columns, no skew within a column. It is seeded by the dataset's name and version, so the same metadata gives the same mock.

A column with a published profile (`ColumnProfile`, computed at registration) gets its share of
missing values and, if numeric, of exact zeros: what decides whether `log(income)` fails or
rows drop out of a fit; a categorical or ordinal column draws its levels in their published
shares, so a small group is small on the mock too. "some" (under 5 %) becomes `SOME_SHARE` of
the rows, at least one. A column without a profile (a version registered before profiles) is
drawn as before.
"""

from __future__ import annotations

import hashlib
from datetime import date

import numpy as np
import pandas as pd

from safeaccess.client.metadata import Column, ColumnProfile, DatasetMetadata, Share

#: Most rows a mock has (the real row count above it): a rehearsal must stay cheap.
MAX_MOCK_ROWS = 20_000

# What a numeric column without declared bounds or scale is drawn from (stated in the report).
UNBOUNDED_RANGE = (0.0, 100.0)
# What a date column without declared date_bounds is drawn from (stated in the report).
UNBOUNDED_DATES = (date(2000, 1, 1), date(2024, 12, 31))
# Levels invented for a categorical column that declares none.
UNDECLARED_LEVELS = ("level_1", "level_2", "level_3")
#: The share of mock rows a published "some" (more than none, under 5 %) stands for.
SOME_SHARE = 0.01


def mock_rows(declared_rows: int) -> int:
    return max(1, min(int(declared_rows), MAX_MOCK_ROWS))


def _seed(metadata: DatasetMetadata, version: int) -> int:
    digest = hashlib.sha256(f"{metadata.name}@{version}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _column(col: Column, n: int, rng: np.random.Generator) -> np.ndarray | pd.Series:
    if col.type == "identifier":
        if col.contributor:
            # Contributor units of about 20 records each, like employers of employees.
            return np.arange(n, dtype=np.int64) // 20
        return np.arange(1, n + 1, dtype=np.int64)
    if col.type == "date":
        first, last = col.date_bounds or UNBOUNDED_DATES
        days = rng.integers(first.toordinal(), last.toordinal() + 1, n)
        return pd.Series(pd.to_datetime([date.fromordinal(int(d)) for d in days]))
    if col.type in ("categorical", "ordinal"):
        levels = list(col.levels) if col.levels else list(UNDECLARED_LEVELS)
        shares = col.profile.levels if col.profile is not None and col.levels else None
        if shares:
            # The published shares: a level under 5 % is a small group on the mock too.
            weights = np.array([_fraction(share) for share in shares], dtype=float)
            drawn = rng.choice(len(levels), n, p=weights / weights.sum())
            return pd.Series(np.asarray(levels, dtype=object)[drawn])
        return pd.Series(np.asarray(levels, dtype=object)[rng.integers(0, len(levels), n)])
    low, high = col.bounds or (col.scale if col.scale is not None else UNBOUNDED_RANGE)
    if col.type == "integer":
        return rng.integers(int(np.ceil(low)), int(np.floor(high)) + 1, n, dtype=np.int64)
    return rng.uniform(float(low), float(high), n)


def _fraction(share: Share | None) -> float:
    """The fraction of mock rows a published share stands for."""
    if share is None or share == "none":
        return 0.0
    return SOME_SHARE if share == "some" else int(share) / 100


def _count(share: Share | None, n: int) -> int:
    """How many of `n` mock rows a published share stands for (at least one unless none)."""
    fraction = _fraction(share)
    return min(n, max(1, round(fraction * n))) if fraction else 0


def _profiled(
    col: Column, profile: ColumnProfile, values: np.ndarray | pd.Series, rng: np.random.Generator
) -> pd.Series:
    """`values` with the column's published shares of exact zeros and missing values."""
    series = pd.Series(values)
    n = len(series)
    numeric = col.type in ("integer", "continuous")
    if numeric and col.type == "integer":
        # Uniform integers hit 0 by chance; the published share says how many really are.
        low = series.min() if n else 0
        high = series.max() if n else 0
        series = series.mask(series == 0, 1 if high >= 1 else -1 if low <= -1 else 0)
    order = rng.permutation(n)
    missing = _count(profile.missing, n)
    # Both shares are of all records (as registration counts them), on disjoint rows.
    zeros = _count(profile.zeros, n) if numeric and _zero_inside(col) else 0
    zeros = min(zeros, n - missing)
    if zeros:
        series.iloc[order[missing : missing + zeros]] = 0
    if missing:
        if numeric:
            series = series.astype("float64")
            series.iloc[order[:missing]] = np.nan
        elif col.type == "date":
            series.iloc[order[:missing]] = pd.NaT
        else:
            series = series.astype(object)
            series.iloc[order[:missing]] = None
    return series


def _zero_inside(col: Column) -> bool:
    low, high = col.bounds or (col.scale if col.scale is not None else UNBOUNDED_RANGE)
    return low <= 0 <= high


def mock_frame(metadata: DatasetMetadata, rows: int, version: int = 1) -> pd.DataFrame:
    """The mock of `metadata` with `mock_rows(rows)` records, in column order."""
    n = mock_rows(rows)
    rng = np.random.default_rng(_seed(metadata, version))
    columns: dict[str, np.ndarray | pd.Series] = {}
    # Free text never reaches the sandbox, so the mock has none either.
    for col in metadata.columns:
        if col.type == "text":
            continue
        values = _column(col, n, rng)
        columns[col.name] = (
            _profiled(col, col.profile, values, rng)
            if col.profile is not None and col.type != "identifier"
            else values
        )
    return pd.DataFrame(columns)


def mock_notes(metadata: DatasetMetadata, rows: int) -> list[str]:
    """What the mock had to invent, to be said next to any prediction made on it."""
    notes = []
    first_last = " to ".join(d.isoformat() for d in UNBOUNDED_DATES)
    if mock_rows(rows) < rows:
        notes.append(f"the mock has {mock_rows(rows)} rows, not the {rows} of the dataset")
    for col in metadata.columns:
        if col.type in ("categorical", "ordinal") and not col.levels:
            notes.append(f"{col.name}: no declared levels; the mock uses {UNDECLARED_LEVELS}")
        if col.type == "date" and col.date_bounds is None:
            notes.append(f"{col.name}: no declared date_bounds; the mock draws from {first_last}")
        if col.type in ("integer", "continuous") and col.bounds is None and col.scale is None:
            notes.append(f"{col.name}: no declared bounds; the mock draws from {UNBOUNDED_RANGE}")
        if col.profile is not None and col.type != "identifier":
            shares = [("missing values", col.profile.missing), ("exact zeros", col.profile.zeros)]
            said = [
                f"{_said(share)} {what}" for what, share in shares if share not in (None, "none")
            ]
            if said:
                notes.append(f"{col.name}: the mock has the published " + " and ".join(said))
            if col.profile.levels and col.levels:
                notes.append(f"{col.name}: the mock draws its levels in the published shares")
    return notes


def _said(share: Share | None) -> str:
    return f"under 5 % ({SOME_SHARE:.0%} on the mock)" if share == "some" else f"{share} %"
