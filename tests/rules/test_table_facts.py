"""The one description of a table's facts (`rules.table_facts`) against pandas as reference:
the layout of margins, the released values per statistic and the margins' largest values."""

from __future__ import annotations

import numpy as np
import pandas as pd

from safeaccess.rules.table_facts import CellSums, Layout, TableShape, count_table, magnitude_table

ROWS, COLS = ["a", "b", "c"], ["x", "y"]


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    return pd.DataFrame(
        {
            "r": rng.choice(ROWS, 60),
            "c": rng.choice(COLS, 60),
            "v": rng.normal(10, 4, 60).round(1),
        }
    )


def _shape(margins: bool) -> TableShape:
    return TableShape(
        source="frequency_table",
        row_vars=["r"],
        col_vars=["c"],
        row_labels=[[r] for r in ROWS],
        col_labels=[[c] for c in COLS],
        margins=margins,
        two_way=True,
        value="v",
    )


def _body(df: pd.DataFrame, column: pd.Series) -> np.ndarray:
    cell = df.r.map(ROWS.index) * len(COLS) + df.c.map(COLS.index)
    return column.groupby(cell).agg("sum").reindex(range(len(ROWS) * len(COLS)), fill_value=0)


def test_a_count_table_with_margins_is_pandas_crosstab() -> None:
    df = _frame()
    body = _body(df, pd.Series(1, index=df.index)).to_numpy(dtype=np.int64)
    out = count_table(_shape(True), body)
    ref = pd.crosstab(df.r, df.c, margins=True)
    assert out.facts.cells.counts == ref.to_numpy().tolist()
    assert out.values == ref.to_numpy(dtype=float).tolist()
    assert out.row_labels[-1] == ["All"] and out.col_labels[-1] == ["All"]
    assert out.facts.n_total == len(df)


def test_a_mean_table_with_margins_is_pandas_pivot_table() -> None:
    df = _frame()
    lay = _shape(True).layout
    n = _body(df, pd.Series(1, index=df.index)).to_numpy(dtype=np.int64)
    body_total = _body(df, df.v).to_numpy()
    grid = n.reshape(len(ROWS), len(COLS))
    totals = lay.grid(
        body_total,
        df.groupby("r").v.sum().reindex(ROWS).to_numpy(),
        df.groupby("c").v.sum().reindex(COLS).to_numpy(),
        df.v.sum(),
    )
    tops = np.full((len(n), 3), -np.inf)
    out = magnitude_table(
        _shape(True),
        "mean",
        CellSums(
            counts=n,
            total=totals,
            missing=np.zeros_like(n),
            negative=np.zeros(len(n), dtype=bool),
            top=lay.largest(tops),
        ),
    )
    ref = pd.pivot_table(df, values="v", index="r", columns="c", aggfunc="mean", margins=True)
    assert np.allclose(np.array(out.values, dtype=float), ref.to_numpy(), rtol=1e-12)
    assert out.facts.cells.counts[-1][-1] == int(grid.sum()) == len(df)


def test_the_largest_of_a_margin_are_its_records_largest() -> None:
    df = _frame()
    lay = Layout(len(ROWS), len(COLS), True, True)
    tops = np.full((len(ROWS) * len(COLS), 3), -np.inf)
    for i, r in enumerate(ROWS):
        for j, c in enumerate(COLS):
            best = df[(df.r == r) & (df.c == c)].v.nlargest(3).to_numpy()
            tops[i * len(COLS) + j, : len(best)] = best
    grid = lay.largest(tops)
    for i, r in enumerate(ROWS):
        assert grid[i, -1].tolist() == df[df.r == r].v.nlargest(3).tolist()
    for j, c in enumerate(COLS):
        assert grid[-1, j].tolist() == df[df.c == c].v.nlargest(3).tolist()
    assert grid[-1, -1].tolist() == df.v.nlargest(3).tolist()
