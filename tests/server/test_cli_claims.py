"""`safeaccess-server dataset require-claim`: durable per-dataset claim requirements."""

from __future__ import annotations

from pathlib import Path

import pytest

from safeaccess.server.admin.cli import main
from safeaccess.server.config import DataDir
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.steps import claims as claim_gate
from safeaccess.server.store import Store


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    d = ["--data-dir", str(root)]
    assert main(["init", *d, "--server-id", "sac-test"]) == 0
    csv = tmp_path / "census.csv"
    generate_census(200, seed=1).to_csv(csv, index=False)
    meta = tmp_path / "census.json"
    meta.write_text(census_metadata("census").model_dump_json())
    assert main(["project", "add", "p1", *d]) == 0
    args = ["dataset", "add", "census", "--data", str(csv), "--metadata", str(meta), *d]
    assert main([*args, "--project", "p1"]) == 0
    return root


def _stored(root: Path) -> dict[str, frozenset[str]]:
    data = DataDir(root)
    store = Store(data.database_url(data.load_config()))
    try:
        return claim_gate.requirements(store, "census")
    finally:
        store.close()


def test_require_list_and_drop(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmd = ["dataset", "require-claim", "census", "--data-dir", str(root)]
    assert main([*cmd, "--kind", "model_training", "--claim", "fair"]) == 0
    assert main([*cmd, "--kind", "model_training", "--claim", "explainable"]) == 0
    assert main([*cmd, "--kind", "model_training", "--claim", "fair"]) == 0
    assert "(unchanged)" in capsys.readouterr().out
    # Stored in the database: a fresh store (a restarted server) sees them.
    assert _stored(root) == {"model_training": frozenset({"fair", "explainable"})}
    assert main(cmd) == 0
    assert "model_training: explainable, fair" in capsys.readouterr().out
    assert main([*cmd, "--kind", "model_training", "--claim", "explainable", "--drop"]) == 0
    assert _stored(root) == {"model_training": frozenset({"fair"})}


def test_mistakes_are_refused_and_change_nothing(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cmd = ["dataset", "require-claim", "census", "--data-dir", str(root)]
    assert main([*cmd, "--kind", "model_trainig", "--claim", "fair"]) == 2
    assert "unknown analysis kind 'model_trainig'" in capsys.readouterr().err
    assert main([*cmd, "--kind", "model_training"]) == 2
    assert "both --kind and --claim" in capsys.readouterr().err
    other = ["dataset", "require-claim", "nope", "--data-dir", str(root)]
    assert main([*other, "--kind", "model_training", "--claim", "fair"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert _stored(root) == {}
