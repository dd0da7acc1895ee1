"""The two table builders give the same table (the layout issue's step 0 guard).

`safeaccess.sandbox.compute.tables` (what the runner releases) and `safeaccess.rules.tabulate.
build_table` (what a researcher's own `crosstab`/`pivot_table` use) must agree cell for cell once
both are given the declared levels (as a pandas Categorical for `build_table`): counts, values,
totals, the largest contributions and the margins. The layout issue merges them into one only
after this holds, on the demo census and on generated frames with missing keys and values.
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
from safeaccess.sandbox.compute.tables import frequency_table, magnitude_table
from safeaccess.server.demo_data import census_metadata, generate_census


def _declared(frame: pd.DataFrame, name: str, metadata: DatasetMetadata) -> pd.Series:
    column = next(c for c in metadata.columns if c.name == name)
    return pd.Series(pd.Categorical(frame[name], categories=list(column.levels or [])))


def _flat(grid: object) -> list[float]:
    """Every number of a nested grid (cells of lists, e.g. the top contributions), in order."""
    if isinstance(grid, list | tuple):
        return [x for item in grid for x in _flat(item)]
    return [float(grid)]  # type: ignore[arg-type]


def _padded(top: list[list[list[float]]]) -> list[list[list[float]]]:
    return [[[*cell, 0.0, 0.0, 0.0][:3] for cell in row] for row in top]


def _same(sandbox: TableOutput, rules: TableOutput) -> None:
    assert [str(x) for x in sandbox.row_labels] == [str(x) for x in rules.row_labels]
    assert [str(x) for x in sandbox.col_labels] == [str(x) for x in rules.col_labels]
    assert sandbox.facts is not None and rules.facts is not None
    assert sandbox.facts.cells.counts == rules.facts.cells.counts
    np.testing.assert_allclose(
        np.array(sandbox.values, dtype=float), np.array(rules.values, dtype=float), rtol=1e-9
    )
    for field in ("total", "top", "negative", "missing", "contributors"):
        ours, theirs = getattr(sandbox.facts.cells, field), getattr(rules.facts.cells, field)
        if ours is None or theirs is None:
            assert ours is None and theirs is None, field
            continue
        if field == "top":  # the rules pad a cell's top three with zeros, the runner does not
            ours, theirs = _padded(ours), _padded(theirs)
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


def _own_units(units: pd.Series) -> pd.Series:
    """The runner's convention, which `build_table` leaves to its caller: a record whose
    contributor unit is unknown is a unit of its own (it still contributes to the cell)."""
    out = units.astype(object).copy()
    unknown = out.isna().to_numpy()
    out[unknown] = [f"record {i}" for i in np.flatnonzero(unknown)]
    return out


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
        contributor=None if unit is None else _own_units(frame[unit]),
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
    # non-negative: a negative value in a margin is a known difference (below)
    values = st.floats(0, 1000, allow_nan=False).map(lambda v: round(v, 2))
    if missing_values:
        values = st.one_of(st.none(), values)
    income = draw(st.lists(values, min_size=n, max_size=n))
    return pd.DataFrame({"a": a, "b": b, "income": [np.nan if v is None else v for v in income]})


@settings(max_examples=150, deadline=None)
@given(
    frame=frames(missing_values=False), margins=st.booleans(), agg=st.sampled_from(["sum", "mean"])
)
def test_on_generated_frames(frame: pd.DataFrame, margins: bool, agg: str) -> None:
    _both_frequency(frame, GENERATED, ["a"], ["b"], margins)
    _both_magnitude(frame, GENERATED, ["a"], ["b"], agg, margins)


@pytest.mark.xfail(
    strict=True,
    reason="a magnitude cell's count: the runner counts records with a value, build_table every "
    "record of the cell (a cell of one value and five missing ones passes its threshold); the "
    "layout issue's merged builder takes the runner's rule",
)
@settings(max_examples=100, deadline=None)
@given(frame=frames(missing_values=True), agg=st.sampled_from(["sum", "mean"]))
def test_missing_values_in_a_magnitude_table(frame: pd.DataFrame, agg: str) -> None:
    _both_magnitude(frame, GENERATED, ["a"], ["b"], agg, False)


@pytest.mark.xfail(
    strict=True,
    reason="a margin's largest contributions: the runner keeps a negative one, build_table "
    "counts it as zero; the layout issue's merged builder must pick one (and the dominance rule "
    "say which)",
)
def test_a_negative_value_in_a_margin() -> None:
    frame = pd.DataFrame({"a": ["x"], "b": ["p"], "income": [-1.0]})
    _both_magnitude(frame, GENERATED, ["a"], ["b"], "sum", True)
