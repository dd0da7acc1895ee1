"""Researcher experience through the real server and client.

The local journal of sealed sequences: a script step stops `run` at review; the sealed sequence
was never written anywhere by the researcher, yet after the checker releases the step
`session.resume(id)` and `safeaccess resume ID` reveal the rest. Offline rehearsal: with the
centre gone, `plan.rehearse()` runs the same checks here on what the last connection cached."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives import serialization
from e2e_helpers import Centre

from safeaccess.client.analyses import FrequencyTable, Script
from safeaccess.client.cli import main as client_main
from safeaccess.client.journal import Journal
from safeaccess.client.plan import Plan
from safeaccess.client.session import NotInJournal, OfflineUnavailable, connect
from safeaccess.client.validation import AnalysisInvalid
from safeaccess.server.admin.cli import main as server_cli
from safeaccess.server.demo.data import census_metadata
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.review import decisions as review
from safeaccess.server.service import Service

SCRIPT = Script(code="result = 1")
TABLE = FrequencyTable(rows=["region"], cols=["sex"])


def _release_script(service: Service, sequence_id: str, index: int) -> None:
    assert service.scripts.wait_idle(120)  # the script runs in the background
    review.decide(service.store, sequence_id, index, approve=True, reviewer="checker")


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


def test_a_sequence_stopped_at_review_is_resumed_from_the_journal(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = server
    sealed = centre.seal([SCRIPT, TABLE])  # never written to a file by the researcher
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        first = session.run(sealed)
        assert [r.status for r in first] == ["review"]
        sequence_id = first[0].sequence_id
        journal = Journal()
        kept = [e for e in journal.entries() if e.sequence_id == sequence_id]
        assert len(kept) == 1 and kept[0].sealed == sealed and kept[0].server_url == srv.url
        assert stat.S_IMODE(os.stat(kept[0].path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(journal.directory).st_mode) == 0o700
        listed = {s["id"]: s for s in session.sequences()}
        assert listed[sequence_id]["resumable"] is True
        assert listed[sequence_id]["journal"] == str(kept[0].path)

        _release_script(service, sequence_id, 1)
        results = session.resume(sequence_id)
        assert [r.status for r in results] == ["released", "released"]
        assert results[1].output is not None and results[1].kind == "frequency_table"
        assert {s["id"]: s for s in session.sequences()}[sequence_id]["resumable"] is False

        other = centre.seal([TABLE])
        opened = session.open(other)  # opened without run(): nothing kept in the journal
        with pytest.raises(NotInJournal, match="not in the journal"):
            session.resume(opened.sequence_id)


def test_cli_resume_reveals_the_rest_and_out_is_checked_before_anything_runs(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    service, srv = server
    key = _key_file(centre, tmp_path / "ada.key")
    connection = ["--server", srv.url, "--key", str(key), "--researcher", "ada"]
    sealed_file = tmp_path / "sequence.json"
    sealed_file.write_text(centre.seal([SCRIPT, TABLE]).to_json())

    assert client_main(["run", str(sealed_file), *connection]) == 1
    printed = capsys.readouterr().out
    sequence_id = printed.split("sequence ")[-1].split(":")[0]
    assert f"continue later with: safeaccess resume {sequence_id}" in printed
    sealed_file.unlink()  # the journal keeps it

    assert client_main(["sequences", *connection]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(sequence_id))
    assert line.split()[-1] == "resumable"

    _release_script(service, sequence_id, 1)
    out = tmp_path / "results"
    assert client_main(["resume", sequence_id, *connection, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"sequence {sequence_id}: finished, all 2 steps released" in printed
    assert (out / "summary.json").exists()

    # --out into that folder with another sequence is refused before anything is opened.
    another = tmp_path / "another.json"
    another.write_text(centre.seal([TABLE, TABLE]).to_json())
    before = len(service.store.list_sequences("ada"))
    assert client_main(["run", str(another), *connection, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "already holds the results of another sequence" in error
    assert error.count("\n") == 1
    assert len(service.store.list_sequences("ada")) == before


def test_rehearse_without_the_centre_runs_the_same_checks_on_what_was_cached(
    centre: Centre, server: tuple[Service, EmbeddedServer], capsys: pytest.CaptureFixture[str]
) -> None:
    service, _ = server
    with EmbeddedServer(create_app(service)) as srv:  # a centre that goes away below
        session = connect(srv.url, centre.keys["ada"], "ada", retry_wait=0.01)
        plan = (
            session.plan("census")
            .frequency_table("region", "sex")
            .frequency_table("region", "sex", where="age >= 93")  # few mock rows per cell
            .dp_count(epsilon=1.0, delta=1e-5)  # census answers no DP kinds
            .script("result = df.shape[0]")
            .ols("income ~ age + C(sex)")
        )
        online = plan.rehearse(show=False)
        url = srv.url
    offline = plan.rehearse()  # the centre is unreachable now
    printed = capsys.readouterr().out
    assert not online.offline and offline.offline
    assert offline.steps == online.steps  # the same checks on the same mock
    assert (offline.dataset, offline.rows, offline.mock_rows, offline.ruleset) == (
        online.dataset,
        online.rows,
        online.mock_rows,
        online.ruleset,
    )
    assert offline.disclaimer == online.disclaimer and offline.notes == online.notes
    assert [s.mock_verdict for s in offline.steps[:2]] == ["release", "withhold"]
    assert "does not answer differentially private kinds" in offline.steps[2].refused[0]
    assert printed.splitlines()[1].startswith("OFFLINE: the centre could not be reached")
    assert "Offline" in offline._repr_html_()

    session.close()  # a closed session rehearses offline too (it raised RuntimeError before)
    assert plan.rehearse(show=False).steps == online.steps

    # A centre this client never reached: nothing cached, one clear error.
    assert plan.metadata is not None
    stranger = connect(url + "/elsewhere", centre.keys["ada"], "ada")
    with pytest.raises(OfflineUnavailable, match="connect once while it is reachable"):
        Plan("census@1", plan.metadata).frequency_table("region", "sex").rehearse(stranger)
    stranger.close()


def _metadata_file(path: Path, name: str, notes: dict[str, object]) -> Path:
    raw = json.loads(census_metadata(name).model_dump_json())
    raw["columns"].append({"name": "notes", **notes})  # a "name" in `notes` renames it
    path.write_text(json.dumps(raw))
    return path


def test_free_text_is_kept_out_of_every_analysis_and_bad_types_get_one_line(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    service, srv = server
    frame = centre.census.head(400).assign(notes=[f"Mr Smith at {i} High St" for i in range(400)])
    csv = tmp_path / "people.csv"
    frame.to_csv(csv, index=False)
    meta = tmp_path / "people.json"
    add = ["dataset", "add", "people", "--data", str(csv), "--metadata", str(meta)]
    add += ["--project", "p1", "--data-dir", str(centre.root)]

    _metadata_file(meta, "people", {"type": "timestamp"})
    assert server_cli(add) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "errors.pydantic.dev" not in error
    assert "column 'notes': type 'timestamp' is not supported; use one of categorical, " in error
    assert "identifier, text" in error

    _metadata_file(meta, "people", {"type": "categorical"})  # free text posing as a category
    assert server_cli(add) == 2
    assert "notes: declared categorical without levels, and 400 of its values read as free " in (
        capsys.readouterr().err
    )

    _metadata_file(meta, "people", {"type": "text"})
    assert server_cli(add) == 0
    capsys.readouterr()
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        listed = {c["name"]: c["type"] for c in session.metadata("people").model_dump()["columns"]}
        assert listed["notes"] == "text"
        plan = session.plan("people")
        for add_step in (
            lambda: plan.frequency_table("notes"),
            lambda: plan.frequency_table("region", where="notes == 'Mr Smith at 1 High St'"),
            lambda: plan.script("result = 1", where="notes != ''"),
        ):
            with pytest.raises(AnalysisInvalid, match="'notes' is free text"):
                add_step()
        # A plan sealed without the metadata check is refused by the centre alike.
        unchecked = Plan("people@1").frequency_table("notes")
        sealed = unchecked.seal(
            centre.keys["ada"], researcher="ada", project="p1", server=centre.server_id
        )
        refused = session.run(sealed)[0]
        assert refused.status == "failed" and refused.error_code == "invalid_analysis"
        assert "free text" in (refused.error_message or "")
        # A script's data frame does not hold the column.
        script = session.run(session.seal(session.plan("people").script("result = list(df)")))
        assert script[0].status == "review"
        _release_script(service, script[0].sequence_id, 1)
        columns = session.resume(script[0].sequence_id)[0].output
    assert columns is not None and "region" in columns["result"]
    assert "notes" not in columns["result"]


def test_a_date_column_is_stored_as_dates_and_filters_by_day(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    service, srv = server
    days = pd.to_datetime("2019-01-01") + pd.to_timedelta(np.arange(600) % 730, unit="D")
    frame = centre.census.head(600).assign(admitted=days.strftime("%Y-%m-%d"))
    csv = tmp_path / "admissions.csv"
    frame.to_csv(csv, index=False)
    meta = tmp_path / "admissions.json"
    add = ["dataset", "add", "admissions", "--data", str(csv), "--metadata", str(meta)]
    add += ["--project", "p1", "--data-dir", str(centre.root)]
    _metadata_file(
        meta,
        "admissions",
        {"name": "admitted", "type": "date", "date_bounds": ["2019-01-01", "2019-12-31"]},
    )
    assert server_cli(add) == 2  # 2020 dates past the declared last date
    assert "admitted: dates outside the declared date_bounds 2019-01-01..2019-12-31" in (
        capsys.readouterr().err
    )
    span = ["2019-01-01", "2020-12-31"]
    _metadata_file(meta, "admissions", {"name": "admitted", "type": "date", "date_bounds": span})
    assert server_cli(add) == 0
    capsys.readouterr()

    where = "admitted >= '2019-07-01' and admitted < '2020-01-01'"
    expected = frame[(frame.admitted >= "2019-07-01") & (frame.admitted < "2020-01-01")]
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        plan = session.plan("admissions")
        with pytest.raises(AnalysisInvalid, match="compare it with a date written 'YYYY-MM-DD'"):
            plan.frequency_table("sex", where="admitted >= 'July 2019'")
        with pytest.raises(AnalysisInvalid, match="'admitted' is a date"):
            plan.frequency_table("admitted")
        plan.frequency_table("sex", where=where).script("result = str(df['admitted'].dtype)")
        rehearsed = plan.rehearse(show=False)  # the mock draws days within date_bounds
        assert rehearsed.steps[0].mock_verdict == "release"
        # the mock drew the date column without a word about it (the column profiles add
        # notes of their own about the levels)
        assert not [n for n in rehearsed.notes if "admitted" in n], rehearsed.notes
        results = session.run(session.seal(plan))
        assert results[0].status == "released", results[0].reasons
        _release_script(service, results[1].sequence_id, 2)
        stored = session.resume(results[1].sequence_id)[1].output
    counts = results[0].frame()
    assert counts is not None  # the released counts are pandas' on the same days
    assert counts["count"].to_dict() == expected["sex"].value_counts().to_dict()
    assert stored is not None and stored["result"].startswith("datetime64")
