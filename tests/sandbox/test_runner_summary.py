"""Summary statistics against hand-computed values, R's quantile types and scipy."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from safeaccess.client.analyses import parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import SummaryOutput
from safeaccess.sandbox.runner import execute

META = DatasetMetadata.model_validate(
    {
        "name": "s",
        "columns": [
            {"name": "x", "type": "continuous"},
            {"name": "g", "type": "categorical", "levels": ["a", "b", "c"]},
            {"name": "likert", "type": "ordinal", "scale": [1, 5]},
            {"name": "kids", "type": "integer", "bounds": [0, 10]},
        ],
    }
)

FRAME = pd.DataFrame(
    {
        "x": [float(v) for v in range(1, 11)],
        "g": ["a"] * 5 + ["b"] * 5,
        "likert": [1, 2, 2, 3, 5, 5, 5, 5, 4, 2],
        "kids": [0, 1, 1, 2, 0, 3, 3, 3, 3, 3],
    }
)


def run(body: dict, frame: pd.DataFrame = FRAME) -> SummaryOutput:
    out = execute(parse_analysis(body), frame, META)
    assert isinstance(out, SummaryOutput)
    return out


# x = i^2 for i = 1..40: every released quantile is the mean of the 10 order statistics nearest
# the Hyndman-Fan position, worked out by hand:
# q0.25 type 7: position 1 + 0.25 * 39 = 10.75 -> window 6..15 -> (1240 - 55) / 10 = 118.5
# q0.25 type 1: n p = 10, order statistic 10 -> window 6..15 -> 118.5
# q0.05 type 7: position 2.95 -> window slid to 1..10 -> 385 / 10 = 38.5
# q0.95 type 7: position 38.05 -> window slid to 31..40 -> (22140 - 9455) / 10 = 1268.5
# median: position 20.5 -> window 16..25 -> (5525 - 1240) / 10 = 428.5
SQUARES = pd.DataFrame({"x": [float(i * i) for i in range(1, 41)]})


@pytest.mark.parametrize(
    ("hf_type", "p", "expected"),
    [(7, 0.25, 118.5), (1, 0.25, 118.5), (7, 0.05, 38.5), (7, 0.95, 1268.5)],
)
def test_quantiles_are_windowed_means(hf_type: int, p: float, expected: float) -> None:
    out = run(
        {
            "kind": "summary",
            "variables": ["x"],
            "statistics": ["quantiles", "median"],
            "quantiles": [p],
            "quantile_type": hf_type,
        },
        SQUARES,
    )
    stats_ = out.groups[0].variables[0].stats
    assert stats_[f"q{p}"] == pytest.approx(expected)
    assert stats_["median"] == pytest.approx(428.5)
    assert out.facts.groups[0].variables["x"].quantile_window == 10


def test_type1_quantile_is_not_a_record_value() -> None:
    """Type 1 used to release an order statistic itself; now no quantile equals one record."""
    out = run(
        {
            "kind": "summary",
            "variables": ["x"],
            "statistics": ["quantiles"],
            "quantiles": [0.05 * k for k in range(1, 20)],
            "quantile_type": 1,
        },
        SQUARES,
    )
    released = [v for k, v in out.groups[0].variables[0].stats.items() if k.startswith("q")]
    assert len(released) == 19
    assert not set(released) & set(SQUARES["x"])


def test_moments_and_order_statistics() -> None:
    everything = [
        "count",
        "mean",
        "sd",
        "var",
        "median",
        "min",
        "max",
        "mode",
        "skewness",
        "kurtosis",
        "iqr",
    ]
    out = run({"kind": "summary", "variables": ["likert"], "statistics": everything})
    s = out.groups[0].variables[0].stats
    v = FRAME["likert"].to_numpy(dtype=float)
    assert s["count"] == 10
    assert s["mean"] == pytest.approx(3.4)
    assert s["var"] == pytest.approx(((v - 3.4) ** 2).sum() / 9)
    assert s["sd"] == pytest.approx(np.sqrt(((v - 3.4) ** 2).sum() / 9))
    assert s["median"] == pytest.approx(3.4)  # n = 10: the window is the whole group
    assert (s["min"], s["max"], s["mode"]) == (1.0, 5.0, 5.0)
    assert s["skewness"] == pytest.approx(stats.skew(v, bias=False))
    assert s["kurtosis"] == pytest.approx(stats.kurtosis(v, fisher=True, bias=False))
    assert s["iqr"] == pytest.approx(0.0)  # both ends are the mean of all 10 records


def test_groups_include_declared_empty_level_and_query_set() -> None:
    out = run({"kind": "summary", "variables": ["x"], "by": ["g"], "statistics": ["count", "mean"]})
    assert [g.labels for g in out.groups] == [["a"], ["b"], ["c"]]
    assert [g.variables[0].stats["mean"] for g in out.groups] == [3.0, 8.0, None]
    assert out.groups[2].variables[0].n == 0
    index = out.facts.query_set.to_array()  # type: ignore[union-attr]
    assert index.tolist() == [0] * 5 + [1] * 5


def test_rounding_half_even_on_computed_value() -> None:
    out = run(
        {
            "kind": "summary",
            "variables": ["x"],
            "statistics": ["mean", "sd"],
            "round": 0,
            "where": "x <= 4",
        }
    )
    s = out.groups[0].variables[0].stats
    assert s["mean"] == 2.0  # 2.5 rounds to even
    assert s["sd"] == 1.0  # sd of 1..4 = 1.29


def test_facts_scale_value_counts_and_variance_zero() -> None:
    out = run({"kind": "summary", "variables": ["likert", "kids", "x"], "by": ["g"]})
    b = out.facts.groups[1].variables
    assert b["likert"].scale == (1, 5)
    assert b["likert"].value_counts == {"1": 0, "2": 1, "3": 0, "4": 1, "5": 3}
    assert b["likert"].mode_share == pytest.approx(3 / 5)
    assert b["kids"].scale == (0, 10)  # integer with bounds spanning <= 20 points
    assert b["kids"].variance_zero is True
    assert b["kids"].n_distinct == 1
    assert b["x"].scale is None and b["x"].value_counts is None
    assert out.facts.groups[1].n == 5


def test_statistics_undefined_for_tiny_groups_are_none() -> None:
    out = run(
        {
            "kind": "summary",
            "variables": ["x"],
            "statistics": ["sd", "skewness", "kurtosis"],
            "where": "x <= 2",
        }
    )
    s = out.groups[0].variables[0].stats
    assert s["sd"] == pytest.approx(np.std([1.0, 2.0], ddof=1))
    assert s["skewness"] is None and s["kurtosis"] is None


def test_a_filter_on_the_variable_narrows_the_reconstruction_scale() -> None:
    # kids is declared 0..10; 'kids >= 2' confines every selected record to 2..10
    out = run(
        {"kind": "summary", "variables": ["kids"], "statistics": ["mean"], "where": "kids >= 2"}
    )
    facts = out.facts.groups[0].variables["kids"]
    assert facts.scale == (2, 10)
    assert [(c.low, c.high, c.count) for c in facts.bounds or []] == [(2.0, 10.0, 6)]
    assert set(facts.value_counts or {}) == {str(v) for v in range(2, 11)}
    # a filter on another column records no bounds and keeps the declared scale
    other = run(
        {"kind": "summary", "variables": ["kids"], "statistics": ["mean"], "where": "x > 2"}
    )
    assert other.facts.groups[0].variables["kids"].bounds is None
    assert other.facts.groups[0].variables["kids"].scale == (0, 10)
