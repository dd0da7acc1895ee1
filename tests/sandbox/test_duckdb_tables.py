"""Storage "duckdb": the tables DuckDB computes out of memory equal the in-memory path's.

Differential: random datasets (missing keys, NaN values, negative values, undeclared levels,
declared levels no record has) and random filters, each table computed twice through the
runner's `run_request`, once with the metadata's `storage` "memory" (the loaded frame) and once
with "duckdb"; the framed replies (JSON output and the per-record query set) must be the same
bytes. Plus the refusals this path makes from the analysis and metadata alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.sandbox.backend import RunnerRequest, decode_reply, encode_reply
from safeaccess.sandbox.runner import run_request
from safeaccess.sandbox.runner.duckdb_tables import (
    MAGNITUDE_STATISTICS,
    STORAGE_UNSUPPORTED,
    SUPPORTED_KINDS,
    refusal,
)

pytest.importorskip("duckdb")

FILTERS = [
    None,
    "a >= 1",
    "b in ('x', 'z')",
    "not (v > 0)",
    "v is null or a != 2",
    "a between 1 and 3 and b != 'y'",
    "w < 5 or b is null",
    "not (b = 'x' or v <= -1)",
    "w not between 2 and 6",
    "score in (1, 3.75) or flag = true",
    "a is not null and v > 100",  # selects nothing: 'no_rows' from both
    "b > 1",  # a text column compared with a number: 'bad_filter' from both
    "nope = 1",  # an unknown column: 'bad_filter' from both
]

ANALYSES: list[dict[str, Any]] = [
    {"kind": "frequency_table", "rows": ["a"]},
    {"kind": "frequency_table", "rows": ["a"], "margins": True},
    {"kind": "frequency_table", "rows": ["b"], "cols": ["a"]},
    {"kind": "frequency_table", "rows": ["a", "b"], "cols": ["w"], "margins": True},
    {"kind": "frequency_table", "rows": ["b"], "cols": ["flag"], "margins": True},
    {"kind": "frequency_table", "rows": ["missing_var"]},
    {"kind": "frequency_table", "rows": ["score"], "cols": ["b"], "where": "score >= 1"},
    {"kind": "histogram", "variable": "score", "by": ["flag"], "bins": 2},
    {"kind": "histogram", "variable": "v", "bins": 4},
    {"kind": "histogram", "variable": "v", "by": ["b"], "edges": [-3.0, -0.5, 0.0, 1.5, 3.0]},
    {"kind": "histogram", "variable": "w", "by": ["a"], "bins": 3},
    {"kind": "histogram", "variable": "b"},
    {"kind": "magnitude_table", "rows": ["a"], "value": "v", "agg": "sum"},
    {"kind": "magnitude_table", "rows": ["b"], "cols": ["a"], "value": "v", "agg": "mean"},
    {
        "kind": "magnitude_table",
        "rows": ["a"],
        "cols": ["b"],
        "value": "v",
        "agg": "sum",
        "margins": True,
    },
    {"kind": "magnitude_table", "rows": ["a"], "value": "v", "agg": "mean", "margins": True},
    {"kind": "magnitude_table", "rows": ["b"], "value": "w", "agg": "sum", "margins": True},
]


def _metadata(storage: str) -> DatasetMetadata:
    return DatasetMetadata(
        name="people",
        storage=storage,  # type: ignore[arg-type]
        columns=[
            Column(name="a", type="categorical", levels=[0, 1, 2]),  # 3, 4 occur undeclared
            Column(name="b", type="categorical", levels=["x", "y", "w"]),  # 'w' never occurs
            Column(name="w", type="integer"),
            Column(name="flag", type="categorical"),
            Column(name="v", type="continuous"),
            Column(name="score", type="ordinal", levels=[1, "2.5", 4]),
        ],
    )


def _frame(seed: int, n: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 5, n).astype(float)
    a[rng.random(n) < 0.1] = np.nan
    b = rng.choice(np.array(["x", "y", "z"], dtype=object), n)
    b[rng.random(n) < 0.1] = None
    # Values whose sums are not exact in binary: the totals must still be the same floats.
    v = rng.normal(0, 1, n) * 10 / 3
    v[rng.random(n) < 0.15] = np.nan
    return pd.DataFrame(
        {
            "a": pd.array(a, dtype="Int64"),  # integers with missing values
            "b": b,
            "w": rng.integers(0, 9, n),
            "flag": rng.random(n) < 0.3,
            "v": v,
            # a float key: whole values label as integers, NaN is missing, 3.75 undeclared
            "score": rng.choice(np.array([0.5, 1.0, 2.5, 3.75, np.nan]), n),
        }
    )


def _reply(analysis: dict[str, Any], path: Path, storage: str, dataset: Any = None) -> bytes:
    request = RunnerRequest(
        analysis=analysis,
        metadata=_metadata(storage).model_dump(mode="json"),
        dataset_path=str(path),
    )
    return encode_reply(run_request(request, str(path) if dataset is None else dataset))


def _both(analysis: dict[str, Any], path: Path) -> tuple[bytes, bytes]:
    return _reply(analysis, path, "memory"), _reply(analysis, path, "duckdb")


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 400), where=st.sampled_from(FILTERS))
def test_duckdb_tables_equal_the_in_memory_tables(
    tmp_path: Path, seed: int, n: int, where: str | None
) -> None:
    path = tmp_path / f"data-{seed}-{n}.parquet"
    _frame(seed, n).to_parquet(path, index=False, row_group_size=97)
    for analysis in ANALYSES:
        body = {"where": where, **analysis}
        memory, duck = _both(body, path)
        assert duck == memory, (body, decode_reply(memory), decode_reply(duck))


def test_the_comparison_covers_every_table_kind_of_the_duckdb_path() -> None:
    """Both paths build a table's facts through `rules.table_facts`; the byte comparison above
    shows they hand it the same cells for every kind, statistic and layout DuckDB computes."""
    forms = {
        (a["kind"], a.get("agg"), bool(a.get("margins")), bool(a.get("cols")))
        for a in ANALYSES
        if a["kind"] != "histogram"
    }
    for kind in ("frequency_table", "magnitude_table"):
        for agg in MAGNITUDE_STATISTICS if kind == "magnitude_table" else (None,):
            for margins in (False, True):
                assert any(f[:3] == (kind, agg, margins) for f in forms), (kind, agg, margins)
        assert {f[3] for f in forms if f[0] == kind} == {False, True}, kind
    assert {a["kind"] for a in ANALYSES} == set(SUPPORTED_KINDS)


def test_the_replies_are_tables_with_query_sets(tmp_path: Path) -> None:
    """The comparison above compares outputs, not two identical failures: most succeed."""
    path = tmp_path / "data.parquet"
    _frame(7, 3000).to_parquet(path, index=False, row_group_size=500)
    failing = (
        {"kind": "frequency_table", "rows": ["missing_var"]},
        {"kind": "histogram", "variable": "b"},
    )
    for analysis in [a for a in ANALYSES if a not in failing]:
        reply = decode_reply(_reply(analysis, path, "duckdb"))
        assert reply is not None and reply.response.ok, analysis
        # the cells, then the records left out for a missing value or key (one or two)
        assert 2 <= len(reply.arrays) <= 3 and {len(a) for a in reply.arrays} == {3000}


def test_open_file_and_descriptor_give_the_same_reply(tmp_path: Path) -> None:
    path = tmp_path / "data.parquet"
    _frame(11, 2500).to_parquet(path, index=False, row_group_size=300)
    analysis = {
        "kind": "magnitude_table",
        "rows": ["a"],
        "cols": ["b"],
        "value": "v",
        "agg": "mean",
        "margins": True,
        "where": "w < 7",
    }
    expected = _reply(analysis, path, "memory")
    with open(path, "rb") as fh:
        assert _reply(analysis, path, "duckdb", fh) == expected
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 123, os.SEEK_SET)  # a shared offset elsewhere changes nothing (pread)
        assert _reply(analysis, path, "duckdb", fd) == expected
        assert os.lseek(fd, 0, os.SEEK_CUR) == 123
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("analysis", "contributor"),
    [
        ({"kind": "summary", "variables": ["v"]}, False),
        ({"kind": "regression", "formula": "v ~ w"}, False),
        ({"kind": "magnitude_table", "rows": ["a"], "value": "v", "agg": "std"}, False),
        ({"kind": "magnitude_table", "rows": ["a"], "value": "v", "agg": "sum"}, True),
    ],
)
def test_what_duckdb_does_not_compute_is_known_from_the_analysis_and_metadata(
    analysis: dict[str, Any], contributor: bool
) -> None:
    from safeaccess.client.analyses import parse_analysis

    columns = [
        Column(name="a", type="categorical"),
        Column(name="v", type="continuous"),
        Column(name="w", type="integer"),
        Column(name="firm", type="identifier", contributor=contributor),
    ]
    metadata = DatasetMetadata(name="firms", storage="duckdb", columns=columns)
    refused = refusal(parse_analysis(analysis), metadata)
    assert refused is not None and refused.code == STORAGE_UNSUPPORTED


#: Kinds DuckDB does not compute: they read only their columns and give the in-memory reply.
COLUMN_READS: list[dict[str, Any]] = [
    {
        "kind": "summary",
        "variables": ["v", "w"],
        "by": ["b"],
        "statistics": ["count", "mean", "sd", "median", "min", "max"],
    },
    {"kind": "summary", "variables": ["v"], "where": "w < 6"},
    {"kind": "regression", "formula": "v ~ w", "where": "b = 'x'"},
    {"kind": "correlation", "variables": ["v", "w"]},
    {"kind": "magnitude_table", "rows": ["a"], "value": "v", "agg": "std"},
    {"kind": "summary", "variables": ["v"], "where": "w <"},  # a filter that does not parse
    {"kind": "summary", "variables": ["v"], "where": "nobody = 1"},  # an unknown column
]


GOOD_FILTERS = ("w < 6", "b = 'x'")


@pytest.mark.parametrize("analysis", COLUMN_READS)
def test_other_kinds_read_only_their_columns_and_equal_the_in_memory_reply(
    tmp_path: Path, analysis: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    _frame(5, 3000).to_parquet(path, index=False, row_group_size=301)
    memory = _reply(analysis, path, "memory")
    reply = decode_reply(memory)
    assert reply is not None
    # Answers, except the last two (the filter's own errors, which must be the same too).
    assert reply.response.ok == ("where" not in analysis or analysis["where"] in GOOD_FILTERS)
    read: list[list[str] | None] = []
    real = pd.read_parquet

    def spy(source: Any, *args: Any, **kwargs: Any) -> pd.DataFrame:
        read.append(kwargs.get("columns"))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(pd, "read_parquet", spy)
    duck = _reply(analysis, path, "duckdb")
    assert duck == memory, (analysis, decode_reply(memory), decode_reply(duck))
    # Never the whole file: one read, of a strict subset of its columns.
    assert len(read) == 1 and read[0] is not None
    assert set(read[0]) < set(pq.read_schema(path).names), read


def test_a_script_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    analysis = {"kind": "script", "code": "result = 1"}
    request = RunnerRequest(
        analysis=analysis,
        metadata=_metadata("duckdb").model_dump(mode="json"),
        dataset_path=str(tmp_path / "absent.parquet"),
    )
    response = run_request(request, str(tmp_path / "absent.parquet"))
    assert not response.ok and response.error is not None
    assert response.error.code == STORAGE_UNSUPPORTED
    assert "storage 'duckdb'" in response.error.message


def test_memory_storage_is_the_default() -> None:
    from safeaccess.client.analyses import parse_analysis

    metadata = DatasetMetadata(name="d", columns=[Column(name="a", type="categorical")])
    assert metadata.storage == "memory"
    analysis = parse_analysis({"kind": "frequency_table", "rows": ["a"]})
    assert refusal(analysis, metadata) is None


def test_a_duckdb_dataset_has_its_own_template_family() -> None:
    """Its template loads no data (template.py) and imports DuckDB, not statsmodels."""
    from safeaccess.sandbox.runner.kinds import family_for, preload_modules

    for kind in ("frequency_table", "summary", "regression", "no_such_kind"):
        assert family_for(kind, "duckdb") == "duckdb"
        assert family_for(kind, "memory") == family_for(kind) != "duckdb"
    modules = preload_modules("duckdb")
    assert "duckdb" in modules and "safeaccess.sandbox.runner.duckdb_tables" in modules
    assert "statsmodels.api" not in modules


def test_a_frame_in_memory_takes_the_in_memory_path(tmp_path: Path) -> None:
    """The server's QSS grid runs the runner on a small frame it holds: a storage "duckdb"
    dataset's metadata changes nothing there (the outputs are the same by the test above)."""
    frame = _frame(5, 300)
    analysis = {"kind": "frequency_table", "rows": ["a"], "cols": ["b"], "where": "w > 2"}

    def reply(storage: str) -> bytes:
        request = RunnerRequest(
            analysis=analysis, metadata=_metadata(storage).model_dump(mode="json"), dataset_path="x"
        )
        return encode_reply(run_request(request, frame))

    duck = reply("duckdb")
    assert duck == reply("memory")
    decoded = decode_reply(duck)
    assert decoded is not None and decoded.response.ok


@pytest.mark.parametrize(
    "analysis",
    [
        {"kind": "frequency_table", "rows": ["a"], "cols": ["b"]},
        {"kind": "histogram", "variable": "v", "by": ["b"], "bins": 3},
        {"kind": "histogram", "variable": "v", "edges": [-1.0, 0.0, 1.0]},
        {"kind": "magnitude_table", "rows": ["a"], "value": "v", "agg": "mean"},
    ],
)
def test_no_selected_record_takes_as_many_passes_as_an_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, analysis: dict[str, Any]
) -> None:
    """At 100 M records a pass takes seconds: the latency must not tell 0 records from 1."""
    from safeaccess.client.analyses import parse_analysis
    from safeaccess.sandbox.runner import duckdb_cells, duckdb_tables
    from safeaccess.sandbox.runner.compute._common import AnalysisError

    path = tmp_path / "data.parquet"
    _frame(3, 500).to_parquet(path, index=False)
    passes: list[str] = []
    query = duckdb_cells.TableJob.query

    def counted(self: Any, sql: str, params: list[object]) -> Any:
        passes.append(sql)
        return query(self, sql, params)

    monkeypatch.setattr(duckdb_cells.TableJob, "query", counted)
    metadata = _metadata("duckdb")
    duckdb_tables.execute_out_of_memory(parse_analysis(analysis), str(path), metadata)
    answered = len(passes)
    passes.clear()
    empty = parse_analysis({**analysis, "where": "w > 100"})
    with pytest.raises(AnalysisError) as raised:
        duckdb_tables.execute_out_of_memory(empty, str(path), metadata)
    assert raised.value.code == "no_rows"
    assert len(passes) == answered >= 2
