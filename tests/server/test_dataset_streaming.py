"""Registering a dataset larger than memory (storage "duckdb"): its Parquet file is checked and
copied a batch at a time, and the result is the one a registration from memory gives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import safeaccess.server.datasets as datasets
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.server.admin.cli import main as cli_main
from safeaccess.server.config import DataDir, initialise
from safeaccess.server.datasets import check_against_metadata, register_dataset
from safeaccess.server.errors import InvalidRequest
from safeaccess.server.qss.record_ids import read_ids, read_registry
from safeaccess.server.store import Store


def _meta(name: str = "big") -> DatasetMetadata:
    return DatasetMetadata(
        name=name,
        record_key="pid",
        storage="duckdb",
        columns=[
            Column(name="pid", type="identifier"),
            Column(name="nin", type="identifier"),
            Column(name="employer", type="identifier", contributor=True),
            Column(name="region", type="categorical", levels=["N", "S", "E", "W"]),
            Column(name="age", type="integer", bounds=(0, 120), nullable=False),
            Column(name="income", type="continuous", bounds=(0, 1e6)),
        ],
    )


def _frame(n: int, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    income = rng.uniform(0, 1e5, n)
    income[rng.random(n) < 0.1] = np.nan
    return pd.DataFrame(
        {
            "pid": rng.permutation(n) * 7 + 3,
            "nin": [f"AB{i:06d}" for i in range(n)],
            "employer": pd.array(
                np.where(rng.random(n) < 0.05, -1, rng.integers(0, 9, n)), dtype="Int64"
            ).astype("object"),
            "region": rng.choice(["N", "S", "E", "W"], n),
            "age": rng.integers(18, 90, n),
            "income": income,
        }
    ).assign(employer=lambda f: f["employer"].where(f["employer"] != -1, None))


def _centre(root: Path) -> tuple[DataDir, Store]:
    config = initialise(root, server_id="t")
    data = DataDir(root)
    store = Store(data.database_url(config))
    store.add_project("p")
    return data, store


@pytest.fixture
def two_centres(tmp_path: Path) -> Iterator[tuple[tuple[DataDir, Store], tuple[DataDir, Store]]]:
    one, two = _centre(tmp_path / "memory"), _centre(tmp_path / "streamed")
    yield one, two
    one[1].close()
    two[1].close()


def test_a_file_registered_in_batches_gives_what_the_frame_gives(
    tmp_path: Path, two_centres: tuple[tuple[DataDir, Store], tuple[DataDir, Store]]
) -> None:
    (mem_data, mem_store), (big_data, big_store) = two_centres
    frame = _frame(1000)
    source = tmp_path / "big.parquet"
    frame.to_parquet(source, index=False)
    meta = _meta()
    whole = register_dataset(
        mem_data, mem_store, name="big", frame=frame, metadata=meta, project="p"
    )
    streamed = register_dataset(
        big_data, big_store, name="big", source=source, metadata=meta, project="p", batch_rows=97
    )
    assert streamed.rows == whole.rows == 1000
    a = pd.read_parquet(mem_data.root / whole.path)
    b = pd.read_parquet(big_data.root / streamed.path)
    # Neither the record key nor the other identifier reach the sandbox's copy.
    assert list(a.columns) == list(b.columns) == ["employer", "region", "age", "income"]
    for column in ("region", "age", "income"):
        pd.testing.assert_series_equal(a[column], b[column], check_dtype=False)
    # Contributors are pseudonyms drawn afresh each time: the same records share one.
    assert b["employer"].isna().equals(frame["employer"].isna())
    pairs = pd.DataFrame({"true": frame["employer"], "pseudo": b["employer"]}).dropna()
    assert pairs.groupby("true")["pseudo"].nunique().eq(1).all()
    assert pairs.groupby("pseudo")["true"].nunique().eq(1).all()
    np.testing.assert_array_equal(
        read_ids(mem_data.root / whole.path, 1000), read_ids(big_data.root / streamed.path, 1000)
    )
    registry_a = read_registry(mem_data.root / whole.path)
    registry_b = read_registry(big_data.root / streamed.path)
    assert registry_a is not None and registry_b is not None
    pd.testing.assert_frame_equal(registry_a, registry_b)


def test_problems_spread_over_batches_are_all_found_as_in_memory(
    tmp_path: Path, two_centres: tuple[tuple[DataDir, Store], tuple[DataDir, Store]]
) -> None:
    _, (data, store) = two_centres
    frame = _frame(1000)
    frame.loc[150, "age"] = None  # second batch: a missing value where none is allowed
    frame.loc[420, "region"] = "X"  # two unknown levels, in two batches
    frame.loc[880, "region"] = "Y"
    frame.loc[999, "income"] = 2e6  # last row: above the declared bound
    frame.loc[610, "age"] = 40.5  # fractional where integers are declared
    source = tmp_path / "bad.parquet"
    frame.to_parquet(source, index=False)
    expected = check_against_metadata(frame, _meta())
    assert len(expected) == 4, expected
    with pytest.raises(InvalidRequest) as refused:
        register_dataset(
            data, store, name="big", source=source, metadata=_meta(), project="p", batch_rows=100
        )
    assert str(refused.value) == "the data does not match its metadata: " + "; ".join(expected)
    # Nothing was registered or written.
    assert store.find_dataset("big") is None
    assert not (data.datasets / "big").exists() or not any((data.datasets / "big").iterdir())


def test_a_larger_than_memory_dataset_is_registered_from_parquet_only(
    tmp_path: Path, two_centres: tuple[tuple[DataDir, Store], tuple[DataDir, Store]]
) -> None:
    _, (data, store) = two_centres
    source = tmp_path / "big.csv"
    _frame(10).to_csv(source, index=False)
    with pytest.raises(InvalidRequest, match="convert the CSV to Parquet"):
        register_dataset(data, store, name="big", source=source, metadata=_meta(), project="p")
    assert store.find_dataset("big") is None


def test_dataset_add_never_loads_a_duckdb_dataset_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "data"
    initialise(root, server_id="t")
    assert cli_main(["project", "add", "p", "--data-dir", str(root)]) == 0
    source = tmp_path / "big.parquet"
    _frame(500).to_parquet(source, index=False)
    metadata = tmp_path / "big.json"
    metadata.write_text(_meta().model_dump_json())

    def whole(path: Path) -> pd.DataFrame:
        raise AssertionError(f"{path} was loaded whole")

    monkeypatch.setattr(datasets, "read_table", whole)
    code = cli_main(
        [
            "dataset", "add", "big", "--data", str(source), "--metadata", str(metadata),
            "--project", "p", "--data-dir", str(root),
        ]
    )  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "dataset big version 1: 500 rows" in out.out
