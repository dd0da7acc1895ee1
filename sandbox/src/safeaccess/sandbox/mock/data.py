"""A mock dataset built from published metadata alone, for rehearsing a plan.

Every value is drawn independently and uniformly from what the metadata declares: a categorical
or ordinal column from its levels, a numeric column between its bounds (or on its scale), an
identifier as a running number. So the mock has the real columns, types, levels and (up to a cap)
row count, and nothing else: no relationship between columns, no skew, no small groups beyond
chance. It is seeded by the dataset's name and version, so the same metadata gives the same mock.
"""

from __future__ import annotations

import hashlib
from datetime import date

import numpy as np
import pandas as pd

from safeaccess.client.metadata import Column, DatasetMetadata

#: Most rows a mock has (the real row count above it): a rehearsal must stay cheap.
MAX_MOCK_ROWS = 20_000

# What a numeric column without declared bounds or scale is drawn from (stated in the report).
UNBOUNDED_RANGE = (0.0, 100.0)
# What a date column without declared date_bounds is drawn from (stated in the report).
UNBOUNDED_DATES = (date(2000, 1, 1), date(2024, 12, 31))
# Levels invented for a categorical column that declares none.
UNDECLARED_LEVELS = ("level_1", "level_2", "level_3")


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
        return pd.Series(np.asarray(levels, dtype=object)[rng.integers(0, len(levels), n)])
    low, high = col.bounds or (col.scale if col.scale is not None else UNBOUNDED_RANGE)
    if col.type == "integer":
        return rng.integers(int(np.ceil(low)), int(np.floor(high)) + 1, n, dtype=np.int64)
    return rng.uniform(float(low), float(high), n)


def mock_frame(metadata: DatasetMetadata, rows: int, version: int = 1) -> pd.DataFrame:
    """The mock of `metadata` with `mock_rows(rows)` records, in column order."""
    n = mock_rows(rows)
    rng = np.random.default_rng(_seed(metadata, version))
    # Free text never reaches the sandbox, so the mock has none either.
    return pd.DataFrame({c.name: _column(c, n, rng) for c in metadata.columns if c.type != "text"})


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
    return notes
