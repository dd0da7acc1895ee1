"""Failure messages reach the researcher without an output check, so they must not carry counts
computed from the data: two datasets that differ only in how many records an analysis selects
must fail with the same message."""

from __future__ import annotations

import pandas as pd
import pytest

from safeaccess.client.analyses import parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.sandbox.runner import execute
from safeaccess.sandbox.runner.compute._common import AnalysisError

META = DatasetMetadata.model_validate(
    {
        "name": "m",
        "columns": [
            {"name": "x", "type": "continuous"},
            {"name": "y", "type": "continuous"},
            {"name": "z", "type": "continuous"},
            {"name": "w", "type": "continuous"},
            {"name": "g", "type": "categorical", "levels": ["a", "b", "c"]},
            {"name": "rare", "type": "categorical", "levels": ["no", "yes"]},
        ],
    }
)


def _frame(n_rare: int) -> pd.DataFrame:
    """40 records, of which `n_rare` have rare == 'yes' (the small group an attacker targets)."""
    n = 40
    return pd.DataFrame(
        {
            "x": [float(i % 7) for i in range(n)],
            "y": [float((i * 3) % 11) for i in range(n)],
            "z": [float((i * 5) % 13) for i in range(n)],
            "w": [float((i * 7) % 17) for i in range(n)],
            "g": [["a", "b", "c"][i % 3] for i in range(n)],
            "rare": ["yes"] * n_rare + ["no"] * (n - n_rare),
        }
    )


def _message(body: dict[str, object], frame: pd.DataFrame) -> str:
    with pytest.raises(AnalysisError) as caught:
        execute(parse_analysis(body), frame, META)
    return caught.value.message


@pytest.mark.parametrize(
    ("body", "sizes"),
    [
        (
            {"kind": "correlation", "variables": ["x", "y"], "where": "rare == 'yes'"},
            (1, 2),
        ),
        (
            {"kind": "regression", "formula": "y ~ x + z + w + C(g)", "where": "rare == 'yes'"},
            (2, 3, 4),
        ),
    ],
)
def test_too_few_rows_does_not_tell_how_many(body: dict[str, object], sizes: tuple[int]) -> None:
    messages = {_message(body, _frame(n)) for n in sizes}
    assert len(messages) == 1, f"the message depends on the number of records: {messages}"


def test_two_sample_group_failure_does_not_count_levels() -> None:
    # 'g' has three declared levels; among the selected records one, or all three, are observed.
    body = {"kind": "test", "test": "t_two_sample", "variable": "x", "group": "g"}
    one_level = _frame(0).assign(g="a")
    three_levels = _frame(0)
    assert _message(body, one_level) == _message(body, three_levels)
