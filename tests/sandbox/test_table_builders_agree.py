"""The runner's tables and a researcher's own `build_table` give the same table.

`safeaccess.sandbox.runner.compute.tables` (what the runner releases) maps an analysis to columns and
calls `safeaccess.rules.tabulate` (the one builder, which `crosstab`/`pivot_table` use too). Given
the declared levels (as a pandas Categorical, or as `levels=` on raw columns) both must agree
cell for cell: counts, values, totals, the largest contributions, spreads, modes and margins, on
the demo census and on generated frames with missing keys, missing and negative values and
unknown contributor units.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from safeaccess.client.analyses import FrequencyTable, MagnitudeTable
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.rules.outputs import TableOutput
from safeaccess.rules.tabulate import build_table
from safeaccess.sandbox.runner.compute.tables import frequency_table, magnitude_table
from safeaccess.server.demo.data import census_metadata, generate_census


def _declared(frame: pd.DataFrame, name: str, metadata: DatasetMetadata) -> pd.Series:
    column = next(c for c in metadata.columns if c.name == name)
    return pd.Series(pd.Categorical(frame[name], categories=list(column.levels or [])))


def _flat(grid: object) -> list[float]:
    """Every number of a nested grid (cells of lists, e.g. the top contributions), in order."""
    if isinstance(grid, list | tuple):
        return [x for item in grid for x in _flat(item)]
    return [float(grid)]  # type: ignore[arg-type]


def _lengths(top: list[list[list[float]]]) -> list[list[int]]:
    return [[len(cell) for cell in row] for row in top]


def _same(sandbox: TableOutput, rules: TableOutput) -> None:
    assert [str(x) for x in sandbox.row_labels] == [str(x) for x in rules.row_labels]
    assert [str(x) for x in sandbox.col_labels] == [str(x) for x in rules.col_labels]
    assert sandbox.facts is not None and rules.facts is not None
    assert sandbox.facts.cells.counts == rules.facts.cells.counts
    np.testing.assert_allclose(
        np.array(sandbox.values, dtype=float), np.array(rules.values, dtype=float), rtol=1e-9
    )
    fields = ("total", "top", "negative", "missing", "contributors")
    for field in (*fields, "mode_count", "deviation_top", "deviation_total"):
        ours, theirs = getattr(sandbox.facts.cells, field), getattr(rules.facts.cells, field)
        if ours is None or theirs is None:
            assert ours is None and theirs is None, field
            continue
        if field.endswith("top"):  # as many contributions as there are, none invented
            assert _lengths(ours) == _lengths(theirs), field
        assert _flat(ours) == pytest.approx(_flat(theirs), rel=1e-9), field


def _both_frequency(
    frame: pd.DataFrame, metadata: DatasetMetadata, rows: list[str], cols: list[str], margins: bool
) -> None:
    analysis = FrequencyTable(rows=rows, cols=cols, margins=margins)
    sandbox = frequency_table(analysis, frame, metadata, len(frame))
    rules = build_table(
        [_declared(frame, r, metadata) for r in rows],
        [_declared(frame, c, metadata) for c in cols],
        row_names=rows,
        col_names=cols,
        margins=margins,
        source="frequency_table",
    )
    _same(sandbox, rules)


def _both_magnitude(
    frame: pd.DataFrame,
    metadata: DatasetMetadata,
    rows: list[str],
    cols: list[str],
    agg: str,
    margins: bool,
) -> None:
    analysis = MagnitudeTable(value="income", agg=agg, rows=rows, cols=cols, margins=margins)
    sandbox = magnitude_table(analysis, frame, metadata, len(frame))
    unit = metadata.contributor_column
    rules = build_table(
        [_declared(frame, r, metadata) for r in rows],
        [_declared(frame, c, metadata) for c in cols],
        row_names=rows,
        col_names=cols,
        values=frame["income"],
        value_name="income",
        statistic=agg,  # type: ignore[arg-type]
        margins=margins,
        # raw ids: build_table makes a record of unknown unit a unit of its own, as the runner
        contributor=None if unit is None else frame[unit],
        source="magnitude_table",
    )
    _same(sandbox, rules)


def test_on_the_demo_census() -> None:
    frame = generate_census(5_000)
    metadata = census_metadata()
    for rows, cols in ((["region"], ["sex"]), (["ethnicity", "sex"], ["employment"])):
        for margins in (False, True):
            _both_frequency(frame, metadata, rows, cols, margins)
            for agg in ("sum", "mean"):
                _both_magnitude(frame, metadata, rows, cols, agg, margins)


GENERATED = DatasetMetadata(
    name="generated",
    columns=[
        Column(name="a", type="categorical", levels=["x", "y", "z"]),
        Column(name="b", type="categorical", levels=["p", "q"]),
        Column(name="income", type="continuous", bounds=(-1000, 1000)),
    ],
)


@st.composite
def frames(draw: st.DrawFn, missing_values: bool) -> pd.DataFrame:
    n = draw(st.integers(1, 60))
    a = draw(st.lists(st.sampled_from(["x", "y", "z", None]), min_size=n, max_size=n))
    b = draw(st.lists(st.sampled_from(["p", "q", None]), min_size=n, max_size=n))
    values = st.floats(-1000, 1000, allow_nan=False).map(lambda v: round(v, 2))
    if missing_values:
        values = st.one_of(st.none(), values)
    income = draw(st.lists(values, min_size=n, max_size=n))
    firm = draw(st.lists(st.sampled_from([1, 2, 3, None]), min_size=n, max_size=n))
    return pd.DataFrame(
        {"a": a, "b": b, "income": [np.nan if v is None else v for v in income], "firm": firm}
    )


# the same columns with a contributor unit (some unknown): dominance by per-unit totals
GENERATED_FIRMS = DatasetMetadata(
    name="generated_firms",
    columns=[*GENERATED.columns, Column(name="firm", type="categorical", contributor=True)],
)


@settings(max_examples=150, deadline=None)
@given(
    frame=frames(missing_values=False),
    margins=st.booleans(),
    agg=st.sampled_from(["sum", "mean", "std", "mode"]),
)
def test_on_generated_frames(frame: pd.DataFrame, margins: bool, agg: str) -> None:
    _both_frequency(frame, GENERATED, ["a"], ["b"], margins)
    _both_magnitude(frame, GENERATED, ["a"], ["b"], agg, margins)
    _both_magnitude(frame, GENERATED_FIRMS, ["a"], ["b"], agg, margins)


@settings(max_examples=100, deadline=None)
@given(
    frame=frames(missing_values=True),
    margins=st.booleans(),
    agg=st.sampled_from(["sum", "mean", "std", "mode"]),
)
def test_missing_values_in_a_magnitude_table(frame: pd.DataFrame, margins: bool, agg: str) -> None:
    """A record without a value is in no cell: not counted towards the threshold (ACRO counts
    values, not records), only in `missing`."""
    _both_magnitude(frame, GENERATED, ["a"], ["b"], agg, margins)


def test_a_negative_value_in_a_margin() -> None:
    """A margin's largest contributions are the contributions made, a negative one included;
    no zero is invented for a margin with fewer than three contributors."""
    frame = pd.DataFrame({"a": ["x"], "b": ["p"], "income": [-1.0]})
    _both_magnitude(frame, GENERATED, ["a"], ["b"], "sum", True)
    table = build_table(
        [frame["a"]], [frame["b"]], values=frame["income"], statistic="sum", margins=True
    )
    assert table.facts is not None and table.facts.cells.top is not None
    assert all(cell == [-1.0] for row in table.facts.cells.top for cell in row)


@settings(max_examples=60, deadline=None)
@given(frame=frames(missing_values=True), margins=st.booleans())
def test_one_way_tables_and_declared_levels(frame: pd.DataFrame, margins: bool) -> None:
    """One-way tables (margins: a total row only) agree too, and `levels=` on raw columns gives
    the same table as the declared levels given as a Categorical."""
    _both_frequency(frame, GENERATED, ["a"], [], margins)
    _both_magnitude(frame, GENERATED, ["a", "b"], [], "mean", margins)
    analysis = FrequencyTable(rows=["a"], cols=["b"], margins=margins)
    sandbox = frequency_table(analysis, frame, GENERATED, len(frame))
    rules = build_table(
        [frame["a"]],
        [frame["b"]],
        row_names=["a"],
        col_names=["b"],
        margins=margins,
        levels=[["x", "y", "z"], ["p", "q"]],
    )
    _same(sandbox, rules)
