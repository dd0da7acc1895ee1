"""A registered dataset version gets its code arrays once; `dataset codes` (re)builds them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from safeaccess.sandbox.codes import MANIFEST, codes_dir, load_codes, sha256_file
from safeaccess.server.admin.cli import main
from safeaccess.server.config import DataDir
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.store import Store


@pytest.fixture
def registered(tmp_path: Path) -> tuple[Path, Path]:
    """A centre with the demo census registered through the admin command; (root, Parquet)."""
    root = tmp_path / "data"
    d = ["--data-dir", str(root)]
    assert main(["init", *d, "--server-id", "sac-codes"]) == 0
    assert main(["project", "add", "p1", *d]) == 0
    data = tmp_path / "census.parquet"
    generate_census(400, seed=3).to_parquet(data, index=False)
    meta = tmp_path / "census.json"
    meta.write_text(census_metadata("census").model_dump_json())
    assert main(["dataset", "add", "census", "--data", str(data), "--metadata", str(meta), *d]) == 0
    dataset = DataDir(root)
    store = Store(dataset.database_url(dataset.load_config()))
    try:
        row = store.find_dataset("census")
        assert row is not None
        return root, root / row.path
    finally:
        store.close()


def test_registration_writes_the_code_arrays(registered: tuple[Path, Path]) -> None:
    _root, parquet = registered
    manifest = json.loads((codes_dir(parquet) / MANIFEST).read_text())
    assert manifest["dataset_sha256"] == sha256_file(parquet)
    assert manifest["rows"] == 400
    declared = {c.name: c.levels for c in census_metadata("census").columns if c.levels}
    assert declared, "the demo census declares levels"
    for name, levels in declared.items():
        assert manifest["columns"][name]["levels"][: len(levels)] == list(levels)
    codes = load_codes(parquet)
    assert codes is not None and codes.rows == 400


def test_dataset_codes_rebuilds_them_for_an_older_version(
    registered: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root, parquet = registered
    before = (codes_dir(parquet) / MANIFEST).read_text()
    shutil.rmtree(codes_dir(parquet))  # as registered before code arrays existed
    assert load_codes(parquet) is None
    assert main(["dataset", "codes", "census", "--data-dir", str(root)]) == 0
    assert "code arrays written" in capsys.readouterr().out
    assert (codes_dir(parquet) / MANIFEST).read_text() == before


def test_dataset_codes_refuses_an_unknown_version(registered: tuple[Path, Path]) -> None:
    root, parquet = registered
    before = (codes_dir(parquet) / MANIFEST).read_text()
    assert main(["dataset", "codes", "census", "--version", "7", "--data-dir", str(root)]) != 0
    assert (codes_dir(parquet) / MANIFEST).read_text() == before


def test_a_duckdb_version_gets_no_code_arrays(tmp_path: Path) -> None:
    """A storage "duckdb" version is never loaded whole, so registering it does not load it to
    code it, and `dataset codes` says why it has none."""
    root = tmp_path / "data"
    d = ["--data-dir", str(root)]
    assert main(["init", *d, "--server-id", "sac-codes"]) == 0
    assert main(["project", "add", "p1", *d]) == 0
    data = tmp_path / "census.parquet"
    generate_census(200, seed=5).to_parquet(data, index=False)
    meta = tmp_path / "census.json"
    described = census_metadata("census").model_copy(update={"storage": "duckdb"})
    meta.write_text(described.model_dump_json())
    assert main(["dataset", "add", "census", "--data", str(data), "--metadata", str(meta), *d]) == 0
    parquet = next((root / "datasets" / "census").glob("v1.parquet"))
    assert not codes_dir(parquet).exists()
    assert main(["dataset", "codes", "census", *d]) != 0
    assert not codes_dir(parquet).exists()
