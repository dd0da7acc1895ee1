"""Per-record query sets travel beside the JSON reply, never inside it; the runner reads only the
columns an analysis needs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from safeaccess.client.analyses import FrequencyTable, MagnitudeTable, Regression, Script
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.rules.outputs import QuerySet, cell_dtype, query_set_of
from safeaccess.sandbox.backend import (
    REPLY_MAGIC,
    RunnerRequest,
    RunnerResponse,
    decode_reply,
    encode_reply,
)
from safeaccess.sandbox.runner import run_request
from safeaccess.sandbox.runner.columns import needed_columns

META = DatasetMetadata(
    name="d",
    columns=[
        Column(name="region", type="categorical", levels=["N", "S"]),
        Column(name="sex", type="categorical", levels=["F", "M"]),
        Column(name="age", type="integer"),
        Column(name="income", type="continuous"),
        Column(name="employer", type="identifier", contributor=True),
    ],
)


def _dataset(tmp_path: Path, n: int = 200) -> Path:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "region": rng.choice(["N", "S"], n),
            "sex": rng.choice(["F", "M"], n),
            "age": rng.integers(20, 60, n),
            "income": rng.uniform(1, 2, n),
            "employer": rng.integers(0, 5, n),
        }
    )
    path = tmp_path / "d.parquet"
    frame.to_parquet(path, index=False)
    return path


def _reply(tmp_path: Path, analysis: FrequencyTable) -> tuple[bytes, RunnerResponse]:
    path = _dataset(tmp_path)
    request = RunnerRequest(
        analysis=analysis.model_dump(mode="json"),
        metadata=META.model_dump(mode="json"),
        dataset_path=str(path),
    )
    response = run_request(request, str(path))
    return encode_reply(response), response


def test_the_query_set_is_a_side_array_not_json(tmp_path: Path) -> None:
    raw, response = _reply(tmp_path, FrequencyTable(rows=["region"], where="age < 40"))
    assert raw[:4] == REPLY_MAGIC
    size = int.from_bytes(raw[4:8], "big")
    body = json.loads(raw[8 : 8 + size])
    # no weights: a table's cells are 0/1 rows
    assert body["output"]["facts"]["query_set"] == {
        "labels": ["N", "S"],
        "array": 0,
        "weights": None,
        "row_labels": None,
    }
    assert size < 4 * 200  # the JSON does not hold one entry per record
    reply = decode_reply(raw)
    # The table's cells, then the records it left out for a missing region (array 1).
    assert reply is not None and len(reply.arrays) == 2
    assert body["output"]["facts"]["missing_query_sets"] == [
        {"labels": ["missing region"], "array": 1, "weights": None, "row_labels": None}
    ]
    qs = query_set_of(reply.response.output)  # type: ignore[arg-type]
    assert qs is not None and qs.attached
    frame = pd.read_parquet(_dataset(tmp_path))
    expected = np.where(frame["age"] < 40, (frame["region"] == "S").astype(int), -1)
    assert qs.to_array().tolist() == expected.tolist()
    assert response.ok


def test_a_reply_whose_array_is_missing_or_out_of_range_is_invalid(tmp_path: Path) -> None:
    _, response = _reply(tmp_path, FrequencyTable(rows=["region"]))
    qs = query_set_of(response.output)  # type: ignore[arg-type]
    assert qs is not None
    body_only = encode_reply(response, [])
    # explicit empty arrays: the query set moves to the side channel anyway
    assert decode_reply(body_only) is not None
    bad = qs.to_array().copy()
    bad[0] = 7  # a cell the output does not have
    assert decode_reply(encode_reply(response, [bad])) is None
    qs.array = 3  # points at an array the reply does not carry
    assert decode_reply(encode_reply(response, [qs.to_array()])) is None


def test_only_the_needed_columns_are_read() -> None:
    table = MagnitudeTable(value="income", agg="sum", rows=["region"], where="age > 30")
    assert needed_columns(table, META) == ["region", "age", "income", "employer"]
    model = Regression(formula="income ~ age + C(sex)")
    assert needed_columns(model, META) == ["sex", "age", "income", "employer"]
    assert needed_columns(Script(code="print(1)"), META) is None


def test_the_array_travels_in_the_narrowest_type_its_cell_count_allows(tmp_path: Path) -> None:
    raw, response = _reply(tmp_path, FrequencyTable(rows=["region", "sex"]))
    qs = query_set_of(response.output)  # type: ignore[arg-type]
    assert qs is not None and qs.to_array().dtype == np.int8
    # one byte per record beside the JSON (200 records), not four: the cells, then the records
    # left out for a missing key (`missing_query_sets`)
    size = int.from_bytes(raw[4:8], "big")
    assert len(raw) - (8 + size) - 4 - 2 * 9 == 2 * 200
    reply = decode_reply(raw)
    assert reply is not None
    back = query_set_of(reply.response.output)  # type: ignore[arg-type]
    assert back is not None and back.to_array().dtype == np.int8
    assert back.to_array().tolist() == qs.to_array().tolist()
    # the type follows the number of cells, not the values: 200 labels need int16 even when
    # every record is in cell 0, and an int16 array of such a query set round-trips
    wide = QuerySet.from_array([f"c{i}" for i in range(200)], np.zeros(5, dtype=np.int64))
    assert wide.to_array().dtype == np.dtype("<i2")
    assert cell_dtype(127) == np.int8 and cell_dtype(128) == np.dtype("<i2")
    assert cell_dtype(40_000) == np.dtype("<i4")


def test_a_narrowing_attach_refuses_indices_the_type_cannot_hold() -> None:
    # 255 as int8 would wrap to -1 ("behind none"): the record would silently leave its cell
    with pytest.raises(ValueError, match=r"outside -1\.\.1"):
        QuerySet.from_array(["a", "b"], np.array([0, 255], dtype=np.int32))
    with pytest.raises(ValueError, match="integers"):
        QuerySet.from_array(["a", "b"], np.array([0.0, 1.0]))
