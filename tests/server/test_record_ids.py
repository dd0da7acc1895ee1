"""Stable record ids across dataset versions, and the sandbox's copy without identifiers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from safeaccess.client.analyses import FrequencyTable, Summary
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.validation import AnalysisInvalid, validate
from safeaccess.server.config import DataDir, initialise
from safeaccess.server.datasets import register_dataset
from safeaccess.server.errors import InvalidRequest
from safeaccess.server.qss.record_ids import read_ids, read_registry
from safeaccess.server.store import Store


def _meta(name: str, key: str | None = "pid") -> DatasetMetadata:
    return DatasetMetadata(
        name=name,
        record_key=key,
        columns=[
            Column(name="pid", type="identifier"),
            Column(name="employer", type="identifier", contributor=True),
            Column(name="sex", type="categorical", levels=["F", "M"]),
            Column(name="income", type="continuous"),
        ],
    )


def _frame(pids: list[int]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "pid": pids,
            "employer": [1000 + p % 3 for p in pids],
            "sex": ["F" if p % 2 else "M" for p in pids],
            "income": [float(p) * 100 for p in pids],
        }
    )


@pytest.fixture
def centre(tmp_path: Path) -> Iterator[tuple[DataDir, Store]]:
    root = tmp_path / "data"
    config = initialise(root, server_id="t")
    data = DataDir(root)
    store = Store(data.database_url(config))
    store.add_project("p")
    yield data, store
    store.close()


def test_ids_follow_the_key_across_versions(centre: tuple[DataDir, Store]) -> None:
    data, store = centre
    v1 = register_dataset(
        data, store, name="d", frame=_frame([10, 20, 30, 40]), metadata=_meta("d"), project="p"
    )
    # v2: 20 removed, rows in another order, 50 new
    v2 = register_dataset(
        data, store, name="d", frame=_frame([40, 50, 10, 30]), metadata=_meta("d"), project="p"
    )
    ids1 = read_ids(data.root / v1.path, v1.rows)
    ids2 = read_ids(data.root / v2.path, v2.rows)
    assert ids1.tolist() == [0, 1, 2, 3]
    assert ids2.tolist() == [3, 4, 0, 2]  # 40 keeps 3, 50 is new (4), 10 keeps 0, 30 keeps 2
    registry = read_registry(data.root / v2.path)
    assert registry is not None
    assert dict(zip(registry["key"], registry["id"], strict=True)) == {
        10: 0,
        20: 1,
        30: 2,
        40: 3,
        50: 4,
    }
    # a removed record that comes back gets its old id
    v3 = register_dataset(
        data, store, name="d", frame=_frame([20, 60]), metadata=_meta("d"), project="p"
    )
    assert read_ids(data.root / v3.path, v3.rows).tolist() == [1, 5]


def test_the_sandbox_copy_has_no_identifiers(centre: tuple[DataDir, Store]) -> None:
    data, store = centre
    frame = _frame(list(range(1, 31)))
    row = register_dataset(data, store, name="d", frame=frame, metadata=_meta("d"), project="p")
    stored = pd.read_parquet(data.root / row.path)
    assert "pid" not in stored.columns
    assert list(stored["income"]) == list(frame["income"])  # row order kept
    # the contributor unit arrives as a pseudonymous code: same grouping, other values
    codes = stored["employer"].astype(int)
    assert set(codes) <= {0, 1, 2}
    assert set(codes).isdisjoint(set(frame["employer"]))
    pairs = set(zip(frame["employer"], codes, strict=True))
    assert len(pairs) == 3


def test_a_second_version_needs_a_record_key(centre: tuple[DataDir, Store]) -> None:
    data, store = centre
    register_dataset(
        data, store, name="d", frame=_frame([1, 2]), metadata=_meta("d", None), project="p"
    )
    with pytest.raises(InvalidRequest, match="needs a declared record key"):
        register_dataset(
            data, store, name="d", frame=_frame([1, 2]), metadata=_meta("d", None), project="p"
        )
    with pytest.raises(InvalidRequest, match="registered without a record key"):
        register_dataset(
            data, store, name="d", frame=_frame([1, 2]), metadata=_meta("d"), project="p"
        )
    assert [p.name for p in (data.datasets / "d").iterdir() if p.name.startswith("v2")] == []


def test_keys_must_be_unique_and_present(centre: tuple[DataDir, Store]) -> None:
    data, store = centre
    with pytest.raises(InvalidRequest, match="not unique"):
        register_dataset(
            data, store, name="d", frame=_frame([1, 1]), metadata=_meta("d"), project="p"
        )
    frame = _frame([1, 2])
    frame["pid"] = pd.array([1, None], dtype="Int64")
    with pytest.raises(InvalidRequest, match="missing values"):
        register_dataset(data, store, name="d", frame=frame, metadata=_meta("d"), project="p")


def test_the_record_key_must_be_an_identifier() -> None:
    with pytest.raises(ValueError, match="must name a column of type 'identifier'"):
        DatasetMetadata(
            name="d", record_key="sex", columns=[Column(name="sex", type="categorical")]
        )


def test_identifiers_cannot_appear_in_filters_groupings_or_fields() -> None:
    meta = _meta("d")
    for analysis, field in (
        (FrequencyTable(rows=["sex"], where="pid == 10"), "where"),
        (FrequencyTable(rows=["pid"]), "rows[0]"),
        (Summary(variables=["income"], by=["employer"]), "by[0]"),
    ):
        with pytest.raises(AnalysisInvalid) as caught:
            validate(analysis, meta)
        text = str(caught.value)
        assert field in text and "identifier" in text, text


def test_positions_are_ids_for_versions_without_an_id_file(tmp_path: Path) -> None:
    assert read_ids(tmp_path / "v1.parquet", 3).tolist() == [0, 1, 2]
    assert read_ids(tmp_path / "v1.parquet", 3).dtype == np.int32
