"""Researcher-side use inside a TRE, the way ACRO is used: tables checked as they are made.

`crosstab` and `pivot_table` take the arguments of `pd.crosstab` / `pd.pivot_table` (and ACRO's
wrappers of them), build the same `TableOutput` and facts the sandbox runner builds
(`safeaccess.rules.tabulate.build_table`), optionally apply the mitigations the researcher asks
for, and check the result. The returned `CheckedTable` carries the table as a DataFrame, a
DataFrame of the same shape saying per cell "ok" or which checks failed, and the decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from safeaccess.rules.checks.tables import table_findings
from safeaccess.rules.decision import Decision
from safeaccess.rules.engine import check
from safeaccess.rules.mitigation import mitigate
from safeaccess.rules.outputs import TableOutput
from safeaccess.rules.ruleset import DEFAULT_RULESET, RuleSet
from safeaccess.rules.tabulate import TabulationError, build_table


@dataclass(frozen=True)
class CheckedTable:
    """A table with its per-cell check results and the overall decision."""

    table: pd.DataFrame
    cell_status: pd.DataFrame
    decision: Decision
    output: TableOutput

    @property
    def verdict(self) -> str:
        """'release', 'withhold' or 'review'."""
        return self.decision.verdict


def _as_list(axis: Any) -> list[Any]:
    if axis is None:
        return []
    if isinstance(axis, pd.DataFrame):
        return [axis[c] for c in axis.columns]
    if isinstance(axis, list | tuple) and axis and not np.isscalar(axis[0]):
        return list(axis)
    return [axis]


def _names(axis: list[Any], given: Sequence[str] | None, prefix: str) -> list[str]:
    if given is not None:
        if len(given) != len(axis):
            raise TabulationError(f"{len(given)} {prefix} names given for {len(axis)} variables")
        return [str(g) for g in given]
    return [
        str(a.name) if isinstance(a, pd.Series) and a.name is not None else f"{prefix}_{i}"
        for i, a in enumerate(axis)
    ]


def _statistic(aggfunc: Any, has_values: bool) -> Literal["count", "sum", "mean", "std", "mode"]:
    if aggfunc is None:
        if has_values:
            raise TabulationError("values were given without aggfunc; pass aggfunc='mean' or 'sum'")
        return "count"
    name = aggfunc if isinstance(aggfunc, str) else getattr(aggfunc, "__name__", str(aggfunc))
    name = {
        "size": "count",
        "len": "count",
        "average": "mean",
        "nanmean": "mean",
        "agg_mode": "mode",  # ACRO's name for it
    }.get(name, name)
    if name in ("count", "sum", "mean", "std", "mode"):
        if name != "count" and not has_values:
            raise TabulationError(f"aggfunc '{name}' needs a column of values")
        return name  # type: ignore[return-value]
    raise TabulationError(
        f"aggfunc {name!r} is not supported in a checked table (use 'count', 'sum', 'mean', "
        "'std' or 'mode'); medians, quantiles and extremes per group are summary statistics "
        "with their own rules"
    )


def _frame(output: TableOutput, margins_name: str, cells: np.ndarray | list[Any]) -> pd.DataFrame:
    def index(labels: list[list[Any]], names: list[str]) -> pd.Index:
        fixed = [
            [margins_name] * max(len(names), 1)
            if lab == ["All"] and output.margins and k == len(labels) - 1
            else lab
            for k, lab in enumerate(labels)
        ]
        if len(names) <= 1:
            name = names[0] if names else None
            return pd.Index(
                [lab[0] if lab else (output.value or output.statistic) for lab in fixed], name=name
            )
        return pd.MultiIndex.from_tuples([tuple(lab) for lab in fixed], names=names)

    return pd.DataFrame(
        cells,
        index=index(output.row_labels, output.row_vars),
        columns=index(output.col_labels, output.col_vars),
    )


def _checked(
    output: TableOutput,
    ruleset: RuleSet | None,
    margins_name: str,
    suppress: bool,
    round_to: int | None,
) -> CheckedTable:
    rs = ruleset or DEFAULT_RULESET
    out = mitigate(output, rs, round_to=round_to, suppress=suppress)
    assert isinstance(out, TableOutput)
    decision = check(out, rs)
    shape = (len(out.values), len(out.values[0]) if out.values else 0)
    names: list[list[set[str]]] = [[set() for _ in range(shape[1])] for _ in range(shape[0])]
    for loc in table_findings(out, rs):
        if loc.row is not None and loc.col is not None and loc.finding.verdict != "release":
            names[loc.row][loc.col].add(loc.finding.check)
    status = [["; ".join(sorted(s)) if s else "ok" for s in row] for row in names]
    if out.suppressed is not None:
        for i, row in enumerate(out.suppressed):
            for j, hidden in enumerate(row):
                if hidden:
                    status[i][j] = "suppressed"
    values = np.array(
        [[np.nan if v is None else v for v in row] for row in out.values], dtype=float
    ).reshape(shape)
    return CheckedTable(
        table=_frame(out, margins_name, values),
        cell_status=_frame(out, margins_name, status),
        decision=decision,
        output=out,
    )


def crosstab(
    index: Any,
    columns: Any = None,
    values: Any = None,
    rownames: Sequence[str] | None = None,
    colnames: Sequence[str] | None = None,
    aggfunc: Any = None,
    margins: bool = False,
    margins_name: str = "All",
    *,
    contributor: Any = None,
    ruleset: RuleSet | None = None,
    suppress: bool = False,
    round_to: int | None = None,
) -> CheckedTable:
    """Cross-tabulate like `pd.crosstab` and check the table (count, sum or mean).

    `contributor` (one id per record, e.g. employer) makes the threshold count distinct units
    and dominance use per-unit totals. `suppress` / `round_to` apply the mitigations of
    `safeaccess.rules.mitigate`; the decision then says what was done.
    """
    rows = _as_list(index)
    cols = _as_list(columns)
    statistic = _statistic(aggfunc, values is not None)
    output = build_table(
        rows,
        cols,
        row_names=_names(rows, rownames, "row"),
        col_names=_names(cols, colnames, "col"),
        values=values,
        value_name=str(values.name) if isinstance(values, pd.Series) and values.name else None,
        statistic=statistic,
        margins=margins,
        contributor=contributor,
    )
    return _checked(output, ruleset, margins_name, suppress, round_to)


def pivot_table(
    data: pd.DataFrame,
    values: str | None = None,
    index: str | list[str] | None = None,
    columns: str | list[str] | None = None,
    aggfunc: Any = "mean",
    margins: bool = False,
    margins_name: str = "All",
    *,
    contributor: str | None = None,
    ruleset: RuleSet | None = None,
    suppress: bool = False,
    round_to: int | None = None,
) -> CheckedTable:
    """Pivot like `pd.pivot_table` (one values column, one aggfunc) and check the table."""
    if index is None:
        raise TabulationError("pivot_table needs at least one index column")
    rows = [index] if isinstance(index, str) else list(index)
    cols = [] if columns is None else ([columns] if isinstance(columns, str) else list(columns))
    missing = [c for c in [*rows, *cols, values, contributor] if c is not None and c not in data]
    if missing:
        raise TabulationError(f"no column named {missing[0]!r} in the data")
    statistic = _statistic(aggfunc, values is not None)
    if statistic == "count":
        values = None
    output = build_table(
        [data[c] for c in rows],
        [data[c] for c in cols],
        row_names=rows,
        col_names=cols,
        values=data[values] if values is not None else None,
        value_name=values,
        statistic=statistic,
        margins=margins,
        contributor=data[contributor] if contributor is not None else None,
    )
    return _checked(output, ruleset, margins_name, suppress, round_to)
