"""The runner's exact statistics for the DP kinds: clipped to the declared bounds, over every
declared level, records capped per contributor unit; checked against pandas computed here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from safeaccess.client.analyses import DPCount, DPHistogram, DPMean, DPMeanTest, DPSum
from safeaccess.client.metadata import Column, DatasetMetadata, NeighbouringRelation
from safeaccess.sandbox.runner import execute


def _meta(**kw: object) -> DatasetMetadata:
    return DatasetMetadata(
        name="t",
        columns=[
            Column(name="g", type="categorical", levels=["a", "b", "c"]),
            Column(name="x", type="continuous", bounds=(0.0, 10.0)),
            Column(name="y", type="integer", bounds=(-5, 5)),
            Column(name="unit", type="identifier", contributor=True),
        ],
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def frame() -> pd.DataFrame:
    # Level "c" is declared but absent; "zz" is present but undeclared; x exceeds its bounds.
    return pd.DataFrame(
        {
            "g": ["a", "a", "b", "zz", None, "a"],
            "x": [1.0, 25.0, -3.0, 4.0, 5.0, np.nan],
            "y": [1, 2, 9, -9, 0, 3],
            "unit": [7, 7, 7, 8, 9, None],
        }
    )


def test_count_covers_declared_levels_and_drops_undeclared(frame: pd.DataFrame) -> None:
    out = execute(DPCount(by=["g"], sigma=1.0), frame, _meta())
    assert out.groups == [["a"], ["b"], ["c"]]
    assert out.facts.values == [[3.0], [1.0], [0.0]]


def test_sum_clips_to_bounds(frame: pd.DataFrame) -> None:
    out = execute(DPSum(variable="x", by=["g"], sigma=1.0), frame, _meta())
    # a: 1 + min(25, 10), and one record left out for its missing value; b: max(-3, 0)
    assert out.components == ["sum(x)", "missing"]
    assert out.facts.values == [[11.0, 1.0], [0.0, 0.0], [0.0, 0.0]]


def test_mean_uses_the_complete_records_and_counts_the_rest(frame: pd.DataFrame) -> None:
    out = execute(DPMean(variables=["x", "y"], by=["g"], sigma=1.0), frame, _meta())
    assert out.components == ["sum(x - 5)", "sum(y - 0)", "count", "missing"]
    # a: the third record's x is missing, so it is left out of both sums (listwise) and counted
    # as missing: x centred (1-5)+(10-5) = 1; y clipped 1+2 = 3; count 2; missing 1
    assert out.facts.values[0] == [1.0, 3.0, 2.0, 1.0]
    assert out.facts.values[1] == [-5.0, 5.0, 1.0, 0.0]
    assert out.facts.values[2] == [0.0, 0.0, 0.0, 0.0]
    # The means of the complete records, as pandas gives them on the clipped values.
    complete = frame.assign(x=frame["x"].clip(0, 10), y=frame["y"].clip(-5, 5)).dropna()
    a = complete[complete["g"] == "a"]
    assert 5 + out.facts.values[0][0] / out.facts.values[0][2] == pytest.approx(a["x"].mean())
    assert out.facts.values[0][1] / out.facts.values[0][2] == pytest.approx(a["y"].mean())


def test_histogram_bins_clipped_values(frame: pd.DataFrame) -> None:
    out = execute(DPHistogram(variable="x", edges=[0, 5, 10], sigma=1.0), frame, _meta())
    # clipped: 1, 10, 0, 4, 5, nan -> [0,5): 1, 0, 4 ; [5,10]: 10, 5; missing: 1
    assert out.components == ["[0, 5)", "[5, 10]", "missing"]
    assert out.facts.values == [[3.0, 2.0, 1.0]]


def test_empty_selection_answers_zeros_not_an_error(frame: pd.DataFrame) -> None:
    out = execute(DPCount(by=["g"], where="x > 1000", sigma=1.0), frame, _meta())
    assert out.facts.values == [[0.0], [0.0], [0.0]]


def test_contributor_relation_caps_records_per_unit(frame: pd.DataFrame) -> None:
    meta = _meta(neighbours=NeighbouringRelation(unit="contributor", max_records_per_unit=2))
    out = execute(DPCount(sigma=1.0), frame, meta)
    # unit 7 has three records, two kept; 8, 9 and the record without a unit are kept.
    assert out.facts.values == [[5.0]]


def test_mean_test_second_moments() -> None:
    meta = DatasetMetadata(
        name="t",
        columns=[
            Column(name="s", type="categorical", levels=["F", "M"]),
            Column(name="x", type="continuous", bounds=(0.0, 2.0)),
        ],
    )
    # The record with a missing x is left out, not counted at the midpoint.
    frame = pd.DataFrame({"s": ["F", "F", "M", "M"], "x": [0.0, 2.0, 1.5, np.nan]})
    out = execute(DPMeanTest(variables=["x"], group="s", epsilon=1.0, delta=1e-6), frame, meta)
    assert out.facts.values == [[0.0, 2.0], [0.5, 1.0]]
    assert out.facts.second_moments == [[[2.0]], [[0.25]]]
