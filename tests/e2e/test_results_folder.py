"""The results folder through the real server and client: `results.save(dir)` and
`safeaccess run --out DIR` write outputs, receipts, the sealed sequence and a summary; the saved
receipts check against the audit log; running a finished sequence again writes the same folder."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from cryptography.hazmat.primitives import serialization
from e2e_helpers import Centre

from safeaccess.client.analyses import Correlation, FrequencyTable
from safeaccess.client.cli import main as client_main
from safeaccess.client.protocol.sealed import SealedSequence
from safeaccess.client.results_folder import ResultsFolderError
from safeaccess.client.session import connect
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _key_file(centre: Centre, path: Path) -> Path:
    path.write_bytes(
        centre.keys["ada"].private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


def test_session_results_save_writes_outputs_receipts_and_summary(
    centre: Centre, server: tuple[Service, EmbeddedServer], tmp_path: Path
) -> None:
    _, srv = server
    sealed = centre.seal(
        [FrequencyTable(rows=["region"]), Correlation(variables=["age", "income"])]
    )
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        results = session.run(sealed)
    assert results.finished, [r.describe() for r in results]
    folder = results.save(tmp_path / "out")

    summary = json.loads((folder / "summary.json").read_text())
    assert summary["sequence_id"] == results[0].sequence_id
    assert summary["outcome"] == "finished: all 2 steps released"
    assert [s["status"] for s in summary["steps"]] == ["released", "released"]
    assert SealedSequence.from_json((folder / "sealed.json").read_bytes()) == sealed

    # The CSV is the released table; the JSON is the full output as received.
    table = pd.read_csv(folder / summary["steps"][0]["csv"], index_col=0)
    census = centre.census
    assert int(table.loc["North"].iloc[0]) == int((census.region == "North").sum())
    assert json.loads((folder / summary["steps"][1]["output"]).read_text()) == results[1].output

    # Each receipt exactly as received, with the output it commits to.
    for step, result in zip(summary["steps"], results, strict=True):
        saved = json.loads((folder / step["receipt"]).read_text())
        assert saved == {"receipt": result.receipt, "output": result.output}
    readme = (folder / "README.md").read_text()
    assert "finished: all 2 steps released" in readme and "receipts/02.json" in readme

    # Running the finished sequence again returns every step and saves the same folder.
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        again = session.run(sealed)
    assert [r.index for r in again] == [1, 2] and again.finished
    assert _tree(again.save(tmp_path / "again")) == _tree(folder)

    # Another sequence's results never go into the same folder.
    other = centre.seal([FrequencyTable(rows=["sex"])])
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        other_results = session.run(other)
    with pytest.raises(ResultsFolderError, match="another sequence"):
        other_results.save(folder)
    assert (
        json.loads((folder / "summary.json").read_text())["sequence_id"] == summary["sequence_id"]
    )


def test_run_out_writes_the_folder_and_again_the_same_folder(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, srv = server
    key = _key_file(centre, tmp_path / "ada.key")
    sealed_file = tmp_path / "seq.json"
    sealed_file.write_text(
        centre.seal(
            [
                FrequencyTable(rows=["sex"]),
                FrequencyTable(rows=["region"]),
                FrequencyTable(rows=["ethnicity"], cols=["region"]),
            ]
        ).to_json()
    )
    base = [str(sealed_file), "--server", srv.url, "--key", str(key), "--researcher", "ada"]
    assert client_main(["run", *base, "--out", str(tmp_path / "first")]) == 1
    first_out = capsys.readouterr().out
    assert "results saved to" in first_out
    assert "step 2 of 3 (frequency_table): revealed, running…" in first_out

    # Running the stopped sequence again prints every step and writes the same folder.
    assert client_main(["run", *base, "--out", str(tmp_path / "second")]) == 1
    again = capsys.readouterr().out
    for line in (
        "step 1 (frequency_table): RELEASED",
        "step 2 (frequency_table): RELEASED",
        "step 3 (frequency_table): WITHHELD",
    ):
        assert line in again
    first, second = _tree(tmp_path / "first"), _tree(tmp_path / "second")
    assert first == second
    assert {"steps/01-frequency_table.csv", "receipts/03.json", "README.md"} <= set(first)
    assert "steps/03-frequency_table.json" not in first  # withheld: no output
    summary = json.loads(first["summary.json"])
    assert summary["outcome"] == "stopped at step 3 of 3 (withheld)"
    assert summary["steps"][2]["reasons"], "the withhold's reasons are listed"

    # A saved receipt checks against the centre's audit log as it is.
    receipt = tmp_path / "first" / "receipts" / "01.json"
    args = ["audit", "receipt", str(receipt), "--server", srv.url, "--key", str(key)]
    assert client_main([*args, "--researcher", "ada"]) == 0
    assert "the log commits to exactly your output" in capsys.readouterr().out
