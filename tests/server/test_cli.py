"""The admin CLI: init, registration, dataset checks, review, serve refusal, and the demo."""

from __future__ import annotations

import json
import stat
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.keys import public_key_text
from safeaccess.server.admin.cli import main
from safeaccess.server.config import DataDir, QssSettings
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.outcome import StepOutcome
from safeaccess.server.qss.record_ids import read_ids
from safeaccess.server.states import StepState
from safeaccess.server.store import Store, catalogue, sequences
from safeaccess.server.store.schema import StepRow


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    assert main(["init", "--data-dir", str(root), "--server-id", "sac-test"]) == 0
    return root


def _files(tmp_path: Path, frame: pd.DataFrame) -> tuple[Path, Path]:
    csv = tmp_path / "census.csv"
    frame.to_csv(csv, index=False)
    meta = tmp_path / "census.json"
    meta.write_text(census_metadata("census").model_dump_json())
    return csv, meta


def test_init_writes_config_and_a_private_key(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = DataDir(root)
    config = yaml.safe_load(data.config_path.read_text())
    assert config["server_id"] == "sac-test"
    assert config["sandbox"]["backend"] == "process"
    assert stat.S_IMODE(data.key_path.stat().st_mode) == 0o600
    assert isinstance(data.load_signing_key(), Ed25519PrivateKey)
    assert main(["init", "--data-dir", str(root)]) == 2
    assert "already initialised" in capsys.readouterr().err


def test_register_project_researcher_and_dataset_versions(root: Path, tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    pub = tmp_path / "ada.pub"
    pub.write_text(public_key_text(key.public_key()))
    frame = generate_census(500, seed=3)
    csv, meta = _files(tmp_path, frame)
    d = ["--data-dir", str(root)]
    assert main(["project", "add", "p1", *d]) == 0
    assert main(["project", "add", "p1", *d]) == 2  # exists
    assert main(["researcher", "add", "ada", "--public-key", str(pub), "--project", "p1", *d]) == 0
    assert (
        main(["researcher", "add", "bob", "--public-key", str(pub), "--project", "nope", *d]) == 2
    )
    args = ["dataset", "add", "census", "--data", str(csv), "--metadata", str(meta), *d]
    assert main([*args, "--project", "p1"]) == 0
    assert main([*args, "--project", "p1", "--qss-mode", "atoms"]) == 0
    # the audit scope is fixed by the first version
    assert main([*args, "--project", "p1", "--qss-scope", "researcher"]) == 2
    data = DataDir(root)
    store = Store(data.database_url(data.load_config()))
    try:
        assert store.get_researcher("bob") is None
        v1 = store.find_dataset("census", 1)
        v2 = store.find_dataset("census")
        assert v1 is not None and v2 is not None and v2.version == 2
        assert store.qss_settings("census") == QssSettings(mode="atoms", scope="project")
        stored = pd.read_parquet(root / v1.path)
        # Row order and values survive the CSV -> Parquet conversion; the record key is not in
        # the sandbox's copy but maps each row to its stable id, the same in both versions.
        assert "person_id" not in stored.columns
        assert stored["income"].tolist() == pytest.approx(frame["income"].tolist())
        ids = read_ids(root / v2.path, v2.rows)
        assert ids.tolist() == list(range(len(frame)))
        assert not (root / v1.path).stat().st_mode & 0o222  # read-only
        assert [d.name for d in catalogue.datasets_for(store, "ada")] == ["census", "census"]
    finally:
        store.close()


def test_metadata_naming_another_version_is_refused(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv, meta = _files(tmp_path, generate_census(200, seed=1))
    d = ["--data-dir", str(root)]
    assert main(["project", "add", "p1", *d]) == 0
    args = ["dataset", "add", "census", "--data", str(csv), "--metadata", str(meta)]
    meta.write_text(census_metadata("census").model_copy(update={"version": 2}).model_dump_json())
    assert main([*args, "--project", "p1", *d]) == 2
    assert "describes census@2" in capsys.readouterr().err
    assert not list((root / "datasets").glob("census/*.parquet"))
    meta.write_text(census_metadata("census").model_copy(update={"version": 1}).model_dump_json())
    assert main([*args, "--project", "p1", *d]) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.assign(extra=1), "no metadata: extra"),
        (lambda f: f.drop(columns=["income"]), "absent from the data: income"),
        (lambda f: f.assign(region="Atlantis"), "region"),
        (lambda f: f.assign(age=f["age"] + 100), "outside the declared bounds"),
        (lambda f: f.assign(age=f["age"] + 0.5), "fractional"),
    ],
)
def test_data_that_disagrees_with_its_metadata_is_refused(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], change: object, message: str
) -> None:
    frame = change(generate_census(200, seed=1))  # type: ignore[operator]
    csv, meta = _files(tmp_path, frame)
    d = ["--data-dir", str(root)]
    assert main(["project", "add", "p1", *d]) == 0
    args = ["dataset", "add", "census", "--data", str(csv), "--metadata", str(meta)]
    assert main([*args, "--project", "p1", *d]) == 2
    assert message in capsys.readouterr().err
    assert not list((root / "datasets").glob("census/*.parquet"))


def test_a_csv_header_naming_a_column_twice_is_refused_by_that_name(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = generate_census(50, seed=1)
    csv, meta = _files(tmp_path, frame)
    header, rest = csv.read_text().split("\n", 1)
    csv.write_text(header.replace("income", "age") + "\n" + rest)  # "age" twice, no "income"
    d = ["--data-dir", str(root)]
    assert main(["project", "add", "p1", *d]) == 0
    args = ["dataset", "add", "census", "--data", str(csv), "--metadata", str(meta)]
    assert main([*args, "--project", "p1", *d]) == 2
    error = capsys.readouterr().err
    assert "the header names 'age' more than once" in error and "age.1" not in error
    assert not list((root / "datasets").glob("census/*.parquet"))


def test_review_list_and_approve_from_the_cli(
    root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    cli_checkers: Callable[[Any, str], str],
) -> None:
    data = DataDir(root)
    store = Store(data.database_url(data.load_config()))
    cli_checkers(store, "carol")
    store.add_project("p1")
    store.add_researcher("ada", "PEM", "fp", ["p1"])
    catalogue.add_dataset(
        store,
        name="d",
        version=1,
        project="p1",
        path="x",
        sha256="0",
        rows=1,
        metadata={},
        rules_path=None,
    )
    seq, _ = sequences.create_sequence(
        store,
        sequence_id="e" * 32,
        researcher="ada",
        project="p1",
        dataset_id=1,
        header=b"h",
        header_hash="hh",
        nonce="n",
        signature=b"s",
        endorsements=[],
        verifier_state={},
        first_step=StepRow(index=1, trace_hash="t", body=b"{}", body_hash="b", last=False),
        event_data={},
    )
    sequences.settle_step(
        store,
        seq.id,
        1,
        StepOutcome(
            state=StepState.REVIEW,
            public_output={"type": "script", "stdout": "hello from the script", "result": 1},
            decision={
                "verdict": "review",
                "ruleset": "default@1",
                "ruleset_hash": "0",
                "findings": [
                    {
                        "check": "script",
                        "verdict": "review",
                        "item": None,
                        "message": "a person checks scripts",
                    }
                ],
            },
        ),
        {},
    )
    store.close()
    d = ["--data-dir", str(root)]
    capsys.readouterr()
    assert main(["review", "list", *d]) == 0
    listing = capsys.readouterr().out
    assert seq.id in listing and "a person checks scripts" in listing
    assert main(["review", "show", seq.id, "1", *d]) == 0
    shown = capsys.readouterr().out
    assert "a person checks scripts" in shown and "hello from the script" in shown
    assert main(["review", "approve", seq.id, "1", "--reviewer", "carol", *d]) == 0
    assert "now released" in capsys.readouterr().out
    assert main(["review", "reject", seq.id, "1", "--reviewer", "carol", *d]) == 2
    assert main(["review", "list", *d]) == 0
    assert "no steps wait" in capsys.readouterr().out


def test_serve_refuses_an_unusable_sandbox(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SAFEACCESS_SANDBOX_BACKEND", "teleport")
    assert main(["serve", "--data-dir", str(root), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "sandbox backend is unusable" in err and "teleport" in err


def test_serve_without_init_says_how_to_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--data-dir", str(tmp_path / "none")]) == 2
    assert "safeaccess-server init" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_releases_then_withholds(tmp_path: Path) -> None:
    lines: list[str] = []
    from safeaccess.server.demo.run import run_demo

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_demo(tmp_path / "demo", rows=4000, out=lines.append) == 0
    # Nothing but the demo's own lines on its first screen (statsmodels' R² of a constant
    # outcome on the query-set grid used to print a RuntimeWarning there).
    noise = [f"{w.filename}: {w.message}" for w in caught if w.category is RuntimeWarning]
    assert not noise, noise
    text, dp_part = "\n".join(lines).split("holds the same people", 1)
    assert text.count("decision: RELEASED") == 3
    assert text.count("decision: WITHHELD") == 1
    assert "never revealed" in text and "aborted" in text
    assert "Traveller" not in text.split("decision: WITHHELD", 1)[1]
    # The DP step: three noisy answers within the budget, then one that does not fit.
    assert dp_part.count("decision: RELEASED") == 3
    assert dp_part.count("decision: WITHHELD") == 1
    assert "because dp_budget" in dp_part and "remains" in dp_part


def test_metadata_yaml_is_accepted(root: Path, tmp_path: Path) -> None:
    frame = generate_census(100, seed=2)
    csv, _ = _files(tmp_path, frame)
    meta = tmp_path / "census.yaml"
    meta.write_text(yaml.safe_dump(json.loads(census_metadata("census").model_dump_json())))
    d = ["--data-dir", str(root)]
    assert main(["project", "add", "p1", *d]) == 0
    assert (
        main(
            [
                "dataset",
                "add",
                "census",
                "--data",
                str(csv),
                "--metadata",
                str(meta),
                "--project",
                "p1",
                *d,
            ]
        )
        == 0
    )


def test_dataset_project_defaults_to_the_only_project(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv, meta = _files(tmp_path, generate_census(100, seed=4))
    d = ["--data-dir", str(root)]
    args = ["dataset", "add", "census", "--data", str(csv), "--metadata", str(meta), *d]
    assert main(args) == 2
    assert "none yet" in capsys.readouterr().err
    assert main(["project", "add", "only", *d]) == 0
    assert main(args) == 0
    assert main(["project", "add", "second", *d]) == 0
    assert main(args) == 2
    assert "only, second" in capsys.readouterr().err
    data = DataDir(root)
    store = Store(data.database_url(data.load_config()))
    try:
        assert store.find_dataset("census").project == "only"  # type: ignore[union-attr]
    finally:
        store.close()


def test_levels_survive_gaps_that_make_a_csv_column_float(root: Path, tmp_path: Path) -> None:
    frame = generate_census(200, seed=5)
    frame["health"] = frame["health"].astype("float64")
    frame.loc[3, "health"] = float("nan")  # read back from CSV as 1.0, 2.0, ... and NaN
    csv, meta = _files(tmp_path, frame)
    d = ["--data-dir", str(root)]
    assert main(["project", "add", "p1", *d]) == 0
    assert main(["dataset", "add", "census", "--data", str(csv), "--metadata", str(meta), *d]) == 0


@pytest.mark.docker
def test_demo_switches_to_docker_with_one_variable(
    tmp_path: Path, sandbox_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The demo builds (here: reuses) the sandbox image itself and records its id in the config.
    from safeaccess.server.config import DataDir
    from safeaccess.server.demo.run import run_demo

    monkeypatch.setenv("SAFEACCESS_SANDBOX_BACKEND", "docker")
    lines: list[str] = []
    assert run_demo(tmp_path / "demo", rows=4000, out=lines.append) == 0
    text = "\n".join(lines)
    assert "(sandbox: docker)" in text
    assert text.count("decision: RELEASED") == 6 and text.count("decision: WITHHELD") == 2
    assert DataDir(tmp_path / "demo").load_config().sandbox.docker.image == sandbox_image


@pytest.mark.parametrize("flag", ["--public-key", "--key"])
@pytest.mark.parametrize("who", ["researcher", "auditor"])
def test_researcher_add_and_auditor_add_take_the_same_key_flags(who: str, flag: str) -> None:
    from safeaccess.server.admin.cli import build_parser

    projects = ["--project", "p1"] if who == "researcher" else []
    args = build_parser().parse_args([who, "add", "eve", flag, "eve.pub", *projects])
    assert args.public_key == Path("eve.pub")


def test_auditor_add_registers_a_key_for_the_audit_endpoints_only(
    root: Path, tmp_path: Path
) -> None:
    from safeaccess.client.keys import generate_keypair
    from safeaccess.server.config import DataDir
    from safeaccess.server.store import Store

    _private, pub = generate_keypair("eve", tmp_path / "keys")
    d = ["--data-dir", str(root)]
    assert main(["auditor", "add", "eve", "--public-key", str(pub), *d]) == 0
    # `--key`, the first spelling, still works: same key, no change.
    assert main(["auditor", "add", "eve", "--key", str(pub), *d]) == 0
    _other, pub2 = generate_keypair("eve2", tmp_path / "keys")
    assert main(["auditor", "add", "eve", "--key", str(pub2), *d]) == 2  # another key
    assert main(["auditor", "add", "not ok", "--key", str(pub), *d]) == 2
    data = DataDir(root)
    store = Store(data.database_url(data.load_config()))
    try:
        assert catalogue.get_auditor(store, "eve") is not None
        assert store.get_researcher("eve") is None
        added = [e for e in store.events() if e.kind == "auditor_added"]
        assert len(added) == 1 and added[0].data["auditor"] == "eve"
    finally:
        store.close()


def test_init_on_an_unreachable_database_changes_nothing_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("psycopg")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = tmp_path / "data"
    url = f"postgresql+psycopg://safeaccess:secret@127.0.0.1:{port}/safeaccess"
    code = main(["init", "--data-dir", str(root), "--database-url", url])
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = err.strip().splitlines()  # one line, no traceback
    assert line.startswith("safeaccess-server: error: cannot use the database"), line
    assert "secret" not in line and "127.0.0.1" in line, line
    assert not root.exists()  # nothing left behind: a retry starts afresh
    assert main(["init", "--data-dir", str(root), "--server-id", "sac-retry"]) == 0
    assert DataDir(root).config_path.exists() and DataDir(root).key_path.exists()
