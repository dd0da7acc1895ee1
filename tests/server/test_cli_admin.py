"""The controller's daily commands: the centre's key, listing and removing accounts and
projects (never erasing evidence), `init --database-url`, and the NA markers `dataset add`
reports. Each bad input leaves the state as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.keys import fingerprint, load_public_key, public_key_text
from safeaccess.server.admin.cli import main
from safeaccess.server.config import DataDir
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.store import Store


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    assert main(["init", "--data-dir", str(root), "--server-id", "sac-admin"]) == 0
    return root


def _pub(tmp_path: Path, name: str) -> tuple[Path, str]:
    key = Ed25519PrivateKey.generate().public_key()
    path = tmp_path / f"{name}.pub"
    path.write_text(public_key_text(key))
    return path, fingerprint(key)


def test_key_show_prints_the_centres_public_key_and_fingerprint(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["key", "show", "--data-dir", str(root)]) == 0
    out = capsys.readouterr().out
    public = DataDir(root).load_signing_key().public_key()
    assert f"fingerprint: {fingerprint(public)}" in out and "server id:   sac-admin" in out
    assert "-----BEGIN PUBLIC KEY-----" in out
    (tmp_path / "centre.pub").write_text(out)  # `key show > centre.pub` is a usable key file
    assert fingerprint(load_public_key(tmp_path / "centre.pub")) == fingerprint(public)


def test_list_and_remove_accounts_and_projects_keep_the_evidence(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = ["--data-dir", str(root)]
    for project in ("p1", "p2", "empty"):
        assert main(["project", "add", project, *d]) == 0
    ada, ada_fp = _pub(tmp_path, "ada")
    bob, _ = _pub(tmp_path, "bob")
    eve, eve_fp = _pub(tmp_path, "eve")
    assert (
        main(
            [
                "researcher",
                "add",
                "ada",
                "--public-key",
                str(ada),
                "--project",
                "p1",
                "--project",
                "p2",
                *d,
            ]
        )
        == 0
    )
    assert main(["researcher", "add", "bob", "--public-key", str(bob), "--project", "p1", *d]) == 0
    assert main(["auditor", "add", "eve", "--key", str(eve), *d]) == 0
    capsys.readouterr()

    assert main(["researcher", "list", *d]) == 0
    out = capsys.readouterr().out
    assert f"ada  {ada_fp}  projects: p1, p2  sequences: 0" in out
    assert main(["auditor", "list", *d]) == 0
    assert f"eve  {eve_fp}" in capsys.readouterr().out
    assert main(["project", "list", *d]) == 0
    assert "p1  researchers: ada, bob  datasets: none" in capsys.readouterr().out

    # Ada has a sequence on record: her account stays; she can be taken out of projects.
    data = DataDir(root)
    store = Store(data.database_url(data.load_config()))
    try:
        _record_a_sequence(store, root, tmp_path, "ada")
    finally:
        store.close()
    assert main(["researcher", "remove", "ada", *d]) == 2
    err = capsys.readouterr().err
    assert "1 sequence(s) on record" in err and "--project P" in err
    assert main(["researcher", "remove", "ada", "--project", "p9", *d]) == 2
    assert "not in project(s) p9" in capsys.readouterr().err
    assert main(["researcher", "remove", "ada", "--project", "p2", *d]) == 0
    assert main(["researcher", "list", *d]) == 0
    assert "projects: p1  sequences: 1" in capsys.readouterr().out

    # Bob has no sequence: his account goes; so do the auditor and the empty project.
    assert main(["researcher", "remove", "bob", *d]) == 0
    assert main(["auditor", "remove", "eve", *d]) == 0
    assert main(["project", "remove", "empty", *d]) == 0
    assert main(["project", "remove", "p1", *d]) == 2  # datasets and sequences on record
    assert "stays" in capsys.readouterr().err
    assert main(["researcher", "list", *d]) == 0
    assert main(["auditor", "list", *d]) == 0
    assert main(["project", "list", *d]) == 0
    out = capsys.readouterr().out
    assert "bob" not in out and "eve" not in out and "empty" not in out and "no auditors" in out
    assert main(["auditor", "remove", "eve", *d]) == 2
    assert "does not exist" in capsys.readouterr().err

    store = Store(data.database_url(data.load_config()))
    try:
        kinds = {e.kind for e in store.events()}
    finally:
        store.close()
    assert {
        "researcher_removed_from_projects",
        "researcher_removed",
        "auditor_removed",
        "project_removed",
    } <= kinds


def _record_a_sequence(store: Store, root: Path, tmp_path: Path, researcher: str) -> None:
    """Register a dataset in p1 and open a sequence row for `researcher` (as the API would)."""
    from safeaccess.server.datasets import register_dataset

    register_dataset(
        DataDir(root),
        store,
        name="census",
        frame=generate_census(300, seed=2),
        metadata=census_metadata("census"),
        project="p1",
    )
    from safeaccess.server.store.schema import SequenceRow

    dataset = store.find_dataset("census")
    assert dataset is not None
    with store.transaction() as s:
        s.add(
            SequenceRow(
                id="0" * 32,
                researcher=researcher,
                project="p1",
                dataset_id=dataset.id,
                header=b"h",
                header_hash="1" * 64,
                nonce="n",
                signature=b"s",
                endorsements=[],
                state="aborted",
                verifier_state={},
            )
        )


def test_init_database_url_goes_into_the_config_and_a_bad_one_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sqlite = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    root = tmp_path / "data"
    assert main(["init", "--data-dir", str(root), "--database-url", sqlite]) == 0
    assert yaml.safe_load(DataDir(root).config_path.read_text())["database_url"] == sqlite
    assert (tmp_path / "elsewhere.db").exists()
    assert f"database:    {sqlite}" in capsys.readouterr().out
    bad = tmp_path / "bad"
    assert main(["init", "--data-dir", str(bad), "--database-url", "not a url"]) == 2
    assert "is not a database URL" in capsys.readouterr().err
    assert not bad.exists()


def test_dataset_add_says_which_na_markers_were_read_as_missing(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = ["--data-dir", str(root)]
    assert main(["project", "add", "p1", *d]) == 0
    frame = generate_census(300, seed=4)
    frame["income"] = frame["income"].astype(object)
    frame.loc[:4, "income"] = "NA"
    frame.loc[5:6, "income"] = ""
    csv = tmp_path / "census.csv"
    frame.to_csv(csv, index=False)
    meta = tmp_path / "census.json"
    meta.write_text(census_metadata("census").model_dump_json())
    capsys.readouterr()
    assert main(["dataset", "add", "census", "--data", str(csv), "--metadata", str(meta), *d]) == 0
    out = capsys.readouterr().out
    assert "read as missing values" in out
    assert "income: 2 cells empty, 5 cells 'NA'" in out


def test_the_annotated_metadata_example_describes_the_demo_census() -> None:
    from safeaccess.server.datasets import check_against_metadata, load_metadata

    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "census.yaml"
    metadata = load_metadata(example)
    assert metadata == census_metadata("census")
    assert check_against_metadata(generate_census(500, seed=1), metadata) == []


def test_every_command_runs_through_the_table() -> None:
    # The admin CLI's handlers are written once (`admin/table.py:run`), driven by its table of
    # commands; only the modules that register their own groups (sandbox, db, queue) differ.
    import argparse
    from functools import partial

    from safeaccess.server.admin import table
    from safeaccess.server.admin.cli import COMMANDS, build_parser

    def leaves(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> dict[str, object]:
        found: dict[str, object] = {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found.update(leaves(sub, (*words, name)))
        if not found and words:
            found[" ".join(words)] = parser.get_default("handler")
        return found

    handlers = leaves(build_parser(), ())
    own = {name: h for name, h in handlers.items() if name.split()[0] in ("sandbox", "db", "queue")}
    tabled = {name: h for name, h in handlers.items() if name not in own}
    assert own and len(tabled) == sum(isinstance(row, table.Command) for row in COMMANDS)
    for name, handler in tabled.items():
        assert isinstance(handler, partial) and handler.func is table.run, name
        assert " ".join(handler.args[0].words) == name
