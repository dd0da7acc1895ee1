"""Std and mode tables with margins: the researcher-side tabulation and the sandbox runner both
give pandas' values (margins computed from the records, not from the cells)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from safeaccess.client.analyses import MagnitudeTable
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.tabulate import build_table
from safeaccess.sandbox.runner import execute


def _smallest_mode(values: pd.Series) -> float:
    counts = values.value_counts()
    return float(min(counts[counts == counts.max()].index))


def _data() -> pd.DataFrame:
    rng = np.random.default_rng(11)
    n = 600
    df = pd.DataFrame(
        {
            "region": rng.choice(["a", "b", "c"], n),
            "sex": rng.choice(["F", "M"], n),
            "score": rng.integers(0, 6, n).astype(float),
        }
    )
    df.loc[df.index[:7], "score"] = np.nan  # missing values are left out
    return df


def _expected(df: pd.DataFrame, stat: str) -> np.ndarray:
    func = "std" if stat == "std" else _smallest_mode
    table = pd.pivot_table(
        df, values="score", index="region", columns="sex", aggfunc=func, margins=True
    )
    return table.to_numpy(dtype=float)


@pytest.mark.parametrize("stat", ["std", "mode"])
def test_tabulated_margins_match_pandas(stat: str) -> None:
    df = _data()
    out = build_table(
        [df.region],
        [df.sex],
        values=df.score,
        statistic=stat,
        margins=True,  # type: ignore[arg-type]
    )
    assert np.allclose(np.array(out.values, dtype=float), _expected(df, stat))


@pytest.mark.parametrize("stat", ["std", "mode"])
def test_runner_margins_match_pandas(stat: str) -> None:
    df = _data()
    meta = DatasetMetadata.model_validate(
        {
            "name": "d",
            "columns": [
                {"name": "region", "type": "categorical", "levels": ["a", "b", "c"]},
                {"name": "sex", "type": "categorical", "levels": ["F", "M"]},
                {"name": "score", "type": "continuous"},
            ],
        }
    )
    analysis = MagnitudeTable(value="score", rows=["region"], cols=["sex"], agg=stat, margins=True)  # type: ignore[arg-type]
    out = execute(analysis, df, meta)
    assert np.allclose(np.array(out.values, dtype=float), _expected(df, stat))  # type: ignore[union-attr]
    cells = out.facts.cells  # type: ignore[union-attr]
    if stat == "mode":
        held = df.groupby(["region", "sex"]).score.agg(lambda s: s.value_counts().max())
        assert cells.mode_count is not None
        assert [row[:2] for row in cells.mode_count[:3]] == held.unstack().to_numpy().tolist()
    else:
        dev = df.groupby(["region", "sex"]).score.agg(lambda s: ((s - s.mean()) ** 2).sum())
        assert cells.deviation_total is not None
        assert np.allclose([row[:2] for row in cells.deviation_total[:3]], dev.unstack().to_numpy())
