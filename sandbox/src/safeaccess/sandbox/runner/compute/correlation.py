"""Correlation matrices (Pearson, Spearman) -> CorrelationOutput.

Missing values are handled by listwise deletion: a record is used only if every variable is
present, so every coefficient rests on the same records, one `n` describes the whole matrix and
the query set is one set (pairwise deletion would give each coefficient its own record set, which
is harder to check and to audit). Spearman is Pearson on average ranks (ties share a rank). A
coefficient involving a constant variable is undefined and reported as None.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from safeaccess.client.analyses import Correlation
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import CorrelationFacts, CorrelationOutput
from safeaccess.sandbox.runner.compute import missing
from safeaccess.sandbox.runner.compute._common import (
    AnalysisError,
    fnum,
    numeric_values,
    query_set,
    require_columns,
)
from safeaccess.sandbox.runner.compute.leverage import leverage_facts, simple_regression_hats


def correlation(
    analysis: Correlation, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> CorrelationOutput:
    """The correlation matrix of `variables` over records with all of them present."""
    names = list(analysis.variables)
    if len(set(names)) != len(names):
        raise AnalysisError("bad_analysis", "list each variable once in a correlation")
    require_columns(frame, names)
    data = np.column_stack([numeric_values(frame, v) for v in names])
    complete = ~np.isnan(data).any(axis=1)
    used = data[complete]
    n = int(used.shape[0])
    if n < 3:
        raise AnalysisError(
            # No count: this message is not output-checked, and n would be a count below any
            # threshold (of the records the filter selects).
            "too_few_rows",
            "fewer than 3 records have all the variables; a correlation needs at least 3",
        )
    table = pd.DataFrame(used, columns=names)
    if analysis.method == "spearman":
        table = table.rank(method="average")
    std = table.std(ddof=0).to_numpy()
    matrix_raw = np.corrcoef(table.to_numpy(), rowvar=False) if np.all(std > 0) else None
    matrix: list[list[float | None]] = []
    for i in range(len(names)):
        row: list[float | None] = []
        for j in range(len(names)):
            if std[i] == 0 or std[j] == 0:
                row.append(None)
            elif matrix_raw is not None:
                row.append(fnum(np.clip(matrix_raw[i, j], -1.0, 1.0)))
            else:
                a, b = table.iloc[:, i].to_numpy(), table.iloc[:, j].to_numpy()
                row.append(fnum(np.clip(np.corrcoef(a, b)[0, 1], -1.0, 1.0)))
        matrix.append(row)
    raw = pd.DataFrame(used, columns=names)
    binary = [v for v in names if raw[v].nunique() == 2]
    pair_tables: dict[str, list[list[int]]] = {}
    for i, a in enumerate(binary):
        for b in binary[i + 1 :]:
            levels_a = np.sort(raw[a].unique())
            levels_b = np.sort(raw[b].unique())
            pair_tables[f"{a}|{b}"] = [
                [int(((raw[a] == la) & (raw[b] == lb)).sum()) for lb in levels_b] for la in levels_a
            ]
    cell = np.where(complete, 0, -1)
    left_out, left_out_sets = missing.listwise(names, complete, frame, n_records)
    return CorrelationOutput(
        method=analysis.method,
        variables=names,
        matrix=matrix,
        n=n,
        missing=left_out,
        facts=CorrelationFacts(
            n=n,
            missing_query_sets=left_out_sets,
            binary=binary,
            pair_tables=pair_tables,
            query_set=query_set(["complete records"], frame, cell, n_records),
            # Spearman: the regressions are those of the ranks, which the coefficients describe
            leverage=leverage_facts(simple_regression_hats(table.to_numpy(dtype=np.float64))),
        ),
    )
