"""The stored code arrays of the job's dataset, for the compute modules' grouping keys.

A fork server template maps its dataset version's code arrays (`safeaccess.sandbox.codes`) and
a job runs under `using(codes)`; `key_for` then hands the table builder a column's stored codes
(selected by the filter, by record position) instead of its values, which the builder would
otherwise code afresh. Without stored codes (a dataset registered before them, a one-shot
runner, a column not coded) `key_for` returns the column itself: the same table, more slowly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import pandas as pd

from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.tabulate import Coded
from safeaccess.sandbox.codes import CodeArrays

_CURRENT: ContextVar[CodeArrays | None] = ContextVar("stored_codes", default=None)


@contextmanager
def using(codes: CodeArrays | None) -> Iterator[None]:
    """Serve `key_for` from `codes` (the arrays of the dataset being computed on) meanwhile."""
    token = _CURRENT.set(codes)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def key_for(frame: pd.DataFrame, name: str, metadata: DatasetMetadata) -> Coded | pd.Series:
    """Column `name` of the (filtered) frame as a table key: its stored codes when there are
    some, else the column. `frame`'s index holds stored record positions."""
    codes = _CURRENT.get()
    column = None if codes is None else codes.columns.get(name)
    if codes is None or column is None:
        return frame[name]
    index = frame.index
    if isinstance(index, pd.RangeIndex) and index.equals(pd.RangeIndex(codes.rows)):
        selected = column.codes
    else:
        selected = np.take(column.codes, index.to_numpy(dtype=np.int64))
    return Coded(name=name, codes=selected, levels=column.levels, fixed=column.fixed)
