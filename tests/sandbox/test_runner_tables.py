"""Frequency tables, magnitude tables and histograms against independent computations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from safeaccess.client.analyses import parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import TableOutput
from safeaccess.sandbox.runner import execute

META = DatasetMetadata.model_validate(
    {
        "name": "t",
        "columns": [
            {"name": "sex", "type": "categorical", "levels": ["F", "M"]},
            {"name": "region", "type": "categorical", "levels": ["N", "S", "W"]},
            {"name": "firm", "type": "identifier", "contributor": True},
            {"name": "pay", "type": "continuous"},
            {"name": "age", "type": "integer"},
        ],
    }
)

# W is a declared region that no record has; row 6 has a missing region.
FRAME = pd.DataFrame(
    {
        "sex": ["F", "M", "F", "M", "F", "F", "M", "M"],
        "region": ["N", "N", "S", "S", "S", "N", None, "S"],
        "firm": ["a", "a", "b", "c", "b", "d", "e", "c"],
        "pay": [10.0, 20.0, 5.0, -3.0, 7.0, np.nan, 1.0, 30.0],
        "age": [20, 30, 40, 50, 60, 70, 80, 90],
    }
)


def run(body: dict) -> TableOutput:
    out = execute(parse_analysis(body), FRAME, META)
    assert isinstance(out, TableOutput)
    return out


def test_frequency_table_counts_match_pandas_and_keep_declared_empty_levels() -> None:
    out = run({"kind": "frequency_table", "rows": ["sex"], "cols": ["region"]})
    expected = pd.crosstab(FRAME["sex"], FRAME["region"]).reindex(
        index=["F", "M"], columns=["N", "S", "W"], fill_value=0
    )
    assert out.values == expected.to_numpy(dtype=float).tolist()
    assert out.facts.cells.counts == expected.to_numpy().tolist()
    assert out.row_labels == [["F"], ["M"]]
    assert out.col_labels == [["N"], ["S"], ["W"]]
    assert out.facts.n_total == 7


def test_frequency_table_query_set_maps_each_record_to_its_cell() -> None:
    out = run({"kind": "frequency_table", "rows": ["sex"], "cols": ["region"]})
    qs = out.facts.query_set
    assert qs is not None
    index = qs.to_array()
    # cells row-major over (F, M) x (N, S, W); record 6 has no region -> -1
    assert index.tolist() == [0, 3, 1, 4, 1, 0, -1, 4]
    assert qs.labels[4] == "M | S"


def test_frequency_table_margins_and_filter() -> None:
    out = run(
        {
            "kind": "frequency_table",
            "rows": ["sex"],
            "cols": ["region"],
            "margins": True,
            "where": "age >= 30",
        }
    )
    kept = FRAME[FRAME["age"] >= 30]
    inner = pd.crosstab(kept["sex"], kept["region"]).reindex(
        index=["F", "M"], columns=["N", "S", "W"], fill_value=0
    )
    grid = np.asarray(out.values)
    assert grid[:2, :3].tolist() == inner.to_numpy(dtype=float).tolist()
    assert grid[:2, 3].tolist() == inner.sum(axis=1).astype(float).tolist()
    assert grid[2, :3].tolist() == inner.sum(axis=0).astype(float).tolist()
    assert grid[2, 3] == float(inner.to_numpy().sum())
    assert out.row_labels[-1] == ["All"] and out.col_labels[-1] == ["All"]
    index = out.facts.query_set.to_array()  # type: ignore[union-attr]
    assert index[0] == -1  # record 0 (age 20) is filtered out


def test_frequency_table_multi_variable_rows_are_tuples() -> None:
    out = run({"kind": "frequency_table", "rows": ["sex", "region"]})
    assert out.row_labels == [[s, r] for s in ["F", "M"] for r in ["N", "S", "W"]]
    assert out.col_labels == [[]]
    by_hand = {("F", "N"): 2, ("F", "S"): 2, ("M", "N"): 1, ("M", "S"): 2}
    assert [v[0] for v in out.values] == [
        float(by_hand.get((s, r), 0)) for s in ["F", "M"] for r in ["N", "S", "W"]
    ]


def test_magnitude_sum_and_mean_against_pandas() -> None:
    out = run({"kind": "magnitude_table", "value": "pay", "rows": ["sex"], "cols": ["region"]})
    sums = FRAME.dropna(subset=["region", "pay"]).groupby(["sex", "region"])["pay"].sum()
    assert out.values[0][0] == sums[("F", "N")] == 10.0
    assert out.values[1][1] == sums[("M", "S")] == 27.0
    assert out.values[0][2] is None  # empty cell
    mean = run({"kind": "magnitude_table", "value": "pay", "rows": ["sex"], "agg": "mean"})
    expected = FRAME.dropna(subset=["pay"]).groupby("sex")["pay"].mean()
    assert mean.values == [[pytest.approx(expected["F"])], [pytest.approx(expected["M"])]]


def test_magnitude_facts_by_contributor_unit() -> None:
    out = run({"kind": "magnitude_table", "value": "pay", "rows": ["sex"]})
    cells = out.facts.cells
    # F: pay 10 (firm a), 5 + 7 (firm b -> 12), NaN (firm d, missing)
    assert cells.counts == [[3], [4]]
    assert cells.missing == [[1], [0]]
    # M: firms a (20), c (-3 + 30 = 27), e (1)
    assert cells.contributors == [[2], [3]]
    assert cells.top == [[[12.0, 10.0]], [[27.0, 20.0, 1.0]]]
    assert cells.total == [[22.0], [48.0]]
    assert cells.negative == [[False], [True]]
    qs = out.facts.query_set.to_array()  # type: ignore[union-attr]
    assert qs[5] == -1  # missing value: not behind the aggregate


def test_magnitude_top_without_contributor_column_uses_records() -> None:
    meta = DatasetMetadata.model_validate(
        {"name": "t", "columns": [c.model_dump() | {"contributor": False} for c in META.columns]}
    )
    out = execute(
        parse_analysis({"kind": "magnitude_table", "value": "pay", "rows": ["sex"]}), FRAME, meta
    )
    assert isinstance(out, TableOutput)
    assert out.facts.cells.top == [[[10.0, 7.0, 5.0]], [[30.0, 20.0, 1.0]]]
    assert out.facts.cells.contributors is None


def test_magnitude_margins_total() -> None:
    out = run(
        {
            "kind": "magnitude_table",
            "value": "pay",
            "rows": ["sex"],
            "cols": ["region"],
            "margins": True,
        }
    )
    complete = FRAME.dropna(subset=["region", "pay"])
    assert out.values[-1][-1] == complete["pay"].sum()
    assert out.facts.cells.counts[-1][-1] == len(complete)
    # all complete records by firm: a = 10 + 20, c = -3 + 30, b = 5 + 7
    assert out.facts.cells.top[-1][-1] == [30.0, 27.0, 12.0]  # type: ignore[index]


def test_histogram_matches_numpy_and_records_edges() -> None:
    out = run({"kind": "histogram", "variable": "age", "bins": 4})
    counts, edges = np.histogram(FRAME["age"], bins=4)
    assert out.values == [counts.astype(float).tolist()]
    assert out.bin_edges is not None and out.bin_edges == edges.tolist()
    assert out.bin_edges[0] == 20 and out.bin_edges[-1] == 90
    assert out.source == "histogram"


def test_histogram_declared_edges_and_groups() -> None:
    out = run({"kind": "histogram", "variable": "age", "edges": [0, 50, 75], "by": ["sex"]})
    # F ages 20, 40, 60, 70; M ages 30, 50, 80 (80 and 90 outside), 90
    assert out.row_labels == [["F"], ["M"]]
    assert out.values == [[2.0, 2.0], [1.0, 1.0]]
    qs = out.facts.query_set.to_array()  # type: ignore[union-attr]
    assert qs[6] == -1 and qs[7] == -1  # ages 80 and 90 are outside the declared edges


def test_categorical_dtype_levels_order_and_unused_categories() -> None:
    frame = pd.DataFrame({"d": pd.Categorical(["p", "q", "p", "p"], categories=["q", "p", "r"])})
    meta = DatasetMetadata.model_validate(
        {"name": "c", "columns": [{"name": "d", "type": "categorical"}]}
    )
    out = execute(parse_analysis({"kind": "frequency_table", "rows": ["d"]}), frame, meta)
    assert isinstance(out, TableOutput)
    assert out.row_labels == [["q"], ["p"], ["r"]]
    assert out.values == [[1.0], [3.0], [0.0]]
