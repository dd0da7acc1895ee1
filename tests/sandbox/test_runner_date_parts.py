"""Date parts on both paths of the runner: in memory (pandas) and over a Parquet file (DuckDB),
whether the file holds the dates as timestamps, as date32 or as 'YYYY-MM-DD' text, against
pandas' `dt` parts of the raw dates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from safeaccess.client.analyses import parse_analysis
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.sandbox.runner import execute
from safeaccess.sandbox.runner.duckdb_tables import execute_out_of_memory

METADATA = DatasetMetadata.model_validate(
    {
        "name": "a",
        "storage": "duckdb",
        "columns": [
            {"name": "sex", "type": "categorical", "levels": ["F", "M"]},
            {"name": "age", "type": "integer", "bounds": [0, 100]},
            {"name": "admitted", "type": "date", "date_bounds": ["2019-03-01", "2020-12-31"]},
        ],
    }
)
N = 400


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    days = pd.Timestamp("2019-03-01") + pd.to_timedelta(rng.integers(0, 640, N), unit="D")
    out = pd.DataFrame(
        {"sex": rng.choice(["F", "M"], N), "age": rng.integers(0, 100, N), "admitted": days}
    )
    out.loc[[3, 50], "admitted"] = pd.NaT
    return out


STORED = {
    "timestamp": lambda f: f,
    "date32": lambda f: f.assign(admitted=f["admitted"].dt.date),
    "text": lambda f: f.assign(admitted=f["admitted"].dt.strftime("%Y-%m-%d")),
}
ANALYSES = [
    {"kind": "frequency_table", "rows": ["year(admitted)"], "cols": ["month(admitted)"]},
    {
        "kind": "frequency_table",
        "rows": ["sex"],
        "where": "year(admitted) == 2020 and day(admitted) <= 10",
    },
    {
        "kind": "magnitude_table",
        "rows": ["month(admitted)"],
        "value": "age",
        "agg": "sum",
        "where": "admitted >= '2019-06-01'",
    },
    {"kind": "histogram", "variable": "age", "edges": [0, 50, 100], "by": ["year(admitted)"]},
]


@pytest.mark.parametrize("stored", list(STORED))
def test_both_paths_give_pandas_parts(frame: pd.DataFrame, stored: str, tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    data = STORED[stored](frame)
    pq.write_table(pa.Table.from_pandas(data, preserve_index=False), path)
    year, month = frame["admitted"].dt.year, frame["admitted"].dt.month
    for body in ANALYSES:
        analysis = parse_analysis(body)
        memory = execute(analysis, data, METADATA)
        duck = execute_out_of_memory(analysis, str(path), METADATA)
        assert duck.values == memory.values and duck.row_labels == memory.row_labels
        mine, theirs = duck.facts.query_set, memory.facts.query_set
        assert mine is not None and theirs is not None and mine.labels == theirs.labels
        assert np.array_equal(mine.to_array(), theirs.to_array())
    by_month = execute(parse_analysis(ANALYSES[0]), data, METADATA)
    assert by_month.values == pd.crosstab(year, month).to_numpy().astype(float).tolist()
    chosen = frame[(year == 2020) & (frame["admitted"].dt.day <= 10)]
    by_sex = execute(parse_analysis(ANALYSES[1]), data, METADATA)
    assert [v for (v,) in by_sex.values] == chosen["sex"].value_counts().sort_index().tolist()
