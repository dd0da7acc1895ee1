"""The missing counts of a storage "duckdb" table (`compute.missing` of the in-memory path).

One streaming pass over the file gives every stored record two cells: whether the filter selects
it with a grouping key missing (the records in no cell), and the group whose value it lacks
(magnitude tables: the body cell; histograms: the `by` group). The counts and query sets are
those `compute/missing.py` gives in memory, byte for byte (`tests/sandbox/test_duckdb_tables.py`).
"""

# S608: the SQL holds only this module's integers, column aliases and the SQL of `duckdb_cells`
# (declared names and placeholders); every value is a bound parameter.
# ruff: noqa: S608

from __future__ import annotations

import numpy as np

from safeaccess.rules.outputs import Label, MissingCount, QuerySet, missing_label
from safeaccess.sandbox.runner.compute._common import AnalysisError
from safeaccess.sandbox.runner.duckdb_cells import Placed, TableJob, _radix_sql

Missing = tuple[list[MissingCount], list[QuerySet]]


def _counts(
    variables: list[str], labels: list[list[Label]], cells: np.ndarray
) -> tuple[list[MissingCount], QuerySet]:
    counts = np.bincount(cells[cells >= 0], minlength=len(labels))
    found = [
        MissingCount(variables=list(variables), group=list(lab), count=int(c))
        for lab, c in zip(labels, counts, strict=True)
    ]
    names = [missing_label(list(variables), list(lab)) for lab in labels]
    return found, QuerySet.from_array(names, cells)


def table_missing(
    job: TableJob,
    table: Placed,
    key_names: list[str],
    value: tuple[str, str] | None,
    group_keys: int,
) -> Missing:
    """The missing counts of a table over `table`'s first len(key_names) keys: per group of its
    first `group_keys` keys (all of them for a magnitude table, the `by` keys of a histogram),
    the selected records whose `value` (name, SQL) is missing; then the selected records with
    a key missing."""
    _, parts, params = table.cell_sql()
    codes = [f"c{i}" for i in range(len(key_names))]
    valid = " AND ".join(f"{c} >= 0" for c in codes) or "TRUE"
    sizes = [len(c.levels) for c in table.coded[:group_keys]]
    group = _radix_sql(codes[:group_keys], sizes)
    f = job.filter
    with_value = "" if value is None else f", {value[1]} AS v"
    lacking = (
        "-1"
        if value is None
        else f"CASE WHEN keep AND {valid} AND v IS NULL THEN {group} ELSE -1 END"
    )
    sql = (
        f"SELECT (CASE WHEN keep AND NOT ({valid}) THEN 0 ELSE -1 END)::INTEGER AS k, "
        f"({lacking})::INTEGER AS g FROM "
        f"(SELECT {', '.join(parts)}{with_value}, coalesce({f.sql}, FALSE) AS keep FROM src)"
    )
    no_key = np.empty(job.source.num_rows, dtype=np.int32)
    no_value = np.empty(job.source.num_rows, dtype=np.int32)
    at = 0
    for batch in job.stream(sql, [*params, *f.params]):
        k, g = batch.column(0).to_numpy(), batch.column(1).to_numpy()
        no_key[at : at + len(k)] = k
        no_value[at : at + len(g)] = g
        at += len(k)
    if at != len(no_key):  # one row per stored record, in order
        raise AnalysisError("dataset_unreadable", "the dataset could not be read as Parquet")
    counts: list[MissingCount] = []
    sets: list[QuerySet] = []
    if value is not None:
        labels: list[list[Label]] = [[]]
        for c in table.coded[:group_keys]:
            labels = [[*lab, x] for lab in labels for x in c.levels]
        found, qs = _counts([value[0]], labels, no_value)
        counts += found
        sets.append(qs)
    if key_names:
        found, qs = _counts(list(key_names), [[]], no_key)
        counts += found
        sets.append(qs)
    return counts, sets
