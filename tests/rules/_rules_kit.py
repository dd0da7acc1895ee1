"""Hand-built outputs for the rules tests (no runner involved)."""

from __future__ import annotations

from safeaccess.rules.outputs import CellFacts, TableFacts, TableOutput


def count_table(
    counts: list[list[int]],
    rows: list[str],
    cols: list[str],
    *,
    row_var: str = "region",
    col_var: str = "sex",
    margins: bool = False,
) -> TableOutput:
    """A frequency table whose values are its counts; with margins, totals are appended."""
    grid = [list(r) for r in counts]
    row_labels: list[list[str | int | float | bool | None]] = [[r] for r in rows]
    col_labels: list[list[str | int | float | bool | None]] = [[c] for c in cols]
    if margins:
        grid = [[*r, sum(r)] for r in grid]
        grid.append([sum(col) for col in zip(*grid, strict=True)])
        row_labels.append(["All"])
        col_labels.append(["All"])
    return TableOutput(
        source="frequency_table",
        statistic="count",
        row_vars=[row_var],
        col_vars=[col_var],
        row_labels=row_labels,
        col_labels=col_labels,
        values=[[float(x) for x in r] for r in grid],
        margins=margins,
        facts=TableFacts(cells=CellFacts(counts=grid), n_total=sum(map(sum, counts))),
    )


def magnitude_table(cells: list[list[list[float]]], *, statistic: str = "sum") -> TableOutput:
    """A one-row magnitude table; each cell is given as its list of contributions."""
    counts = [[len(c) for c in cells[0]]]
    total = [[float(sum(c)) for c in cells[0]]]
    top = [[sorted(c, reverse=True)[:3] for c in cells[0]]]
    negative = [[any(x < 0 for x in c) for c in cells[0]]]
    values = [
        [
            (t if statistic == "sum" else t / n) if n else None
            for t, n in zip(total[0], counts[0], strict=True)
        ]
    ]
    return TableOutput(
        source="magnitude_table",
        statistic=statistic,
        value="turnover",
        row_vars=["sector"],
        col_vars=["size"],
        row_labels=[["C"]],
        col_labels=[[f"s{j}"] for j in range(len(cells[0]))],
        values=values,
        facts=TableFacts(
            cells=CellFacts(
                counts=counts,
                top=top,
                total=total,
                negative=negative,
                missing=[[0] * len(counts[0])],
            ),
            n_total=sum(counts[0]),
        ),
    )
