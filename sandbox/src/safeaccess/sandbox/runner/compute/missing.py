"""The records an answer leaves out for a missing value, counted per group (`MissingCount`).

Every compute module answers on the records whose values are present (no value is imputed) and
reports how many it left out with these helpers, so that one rule holds for every kind: per
group of the answer, the records of the group with a missing value among `variables`; and, for a
grouped answer, the records that fall in no group because a grouping variable is missing. The
records behind each count form a query set (`facts.missing_query_sets`), labelled with
`missing_label`, so that the output rules can suppress a small count and the query-set auditor
sees the released ones.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import Label, MissingCount, QuerySet, missing_label
from safeaccess.sandbox.runner.compute._common import group, query_set

Missing = tuple[list[MissingCount], list[QuerySet]]


def per_group(
    variables: list[str],
    missing: np.ndarray,
    codes: np.ndarray | None,
    labels: list[list[Label]],
    frame: pd.DataFrame,
    n_records: int,
) -> Missing:
    """Per group (`codes`: the group index of each record of `frame`, -1 in none; None: one
    group of every record), the records with `missing` set."""
    if codes is None:
        codes = np.zeros(len(frame), dtype=np.int64)
        labels = [[]]
    cell = np.where(missing & (codes >= 0), codes, -1)
    counts = np.bincount(cell[cell >= 0], minlength=len(labels))
    found = [
        MissingCount(variables=list(variables), group=list(lab), count=int(c))
        for lab, c in zip(labels, counts, strict=True)
    ]
    names = [missing_label(list(variables), list(lab)) for lab in labels]
    return found, [query_set(names, frame, cell, n_records)]


def listwise(
    variables: list[str], complete: np.ndarray, frame: pd.DataFrame, n_records: int
) -> Missing:
    """An ungrouped answer on the complete records: the records it left out."""
    return per_group(variables, ~complete, None, [[]], frame, n_records)


def keys(
    names: list[str], frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> Missing:
    """The records in no group of `names` because one of them is missing (nothing when the
    answer is not grouped)."""
    if not names:
        return [], []
    codes = group(frame, names, metadata).codes
    return per_group(names, codes < 0, None, [[]], frame, n_records)


def joined(*parts: Missing) -> Missing:
    counts: list[MissingCount] = []
    sets: list[QuerySet] = []
    for c, s in parts:
        counts += c
        sets += s
    return counts, sets
