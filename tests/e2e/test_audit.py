"""The audit log end to end: a real server, real sequences, the auditor's verifier through HTTP
and offline, and every tampering the issue names, each detected with the entry named."""

from __future__ import annotations

import base64
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Centre, signed

from safeaccess.client.analyses import FrequencyTable, Script
from safeaccess.client.audit.checkpoint import Checkpoint, sign_checkpoint
from safeaccess.client.audit.merkle import leaf_hash, root_of
from safeaccess.client.audit.records import decode_record, encode_record
from safeaccess.client.audit.verify import AuditFailure, ExportSource, verify_log
from safeaccess.client.cli import main as client_main
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.review import decisions as review
from safeaccess.server.service import Service

SAFE = FrequencyTable(rows=["sex"])
SAFE2 = FrequencyTable(rows=["region"])
UNSAFE = FrequencyTable(rows=["ethnicity"], cols=["region"])


def _pem(key: Ed25519PrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


@dataclass
class Audited:
    service: Service
    url: str
    db: Path
    auditor_key: Path
    server_pub: Path
    ada_key: Path
    released: StepResult
    work: Path


@pytest.fixture(scope="module")
def audited(
    centre: Centre, server: tuple[Service, EmbeddedServer], tmp_path_factory: pytest.TempPathFactory
) -> Audited:
    service, srv = server
    work = tmp_path_factory.mktemp("audit")
    auditor = Ed25519PrivateKey.generate()
    service.store.add_auditor(
        "eve", public_key_text(auditor.public_key()), fingerprint(auditor.public_key())
    )
    server_pub = work / "server.pub"
    server_pub.write_text(public_key_text(service.signing_key.public_key()))
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        first = session.run(centre.seal([SAFE, SAFE2]))
        withheld = session.run(centre.seal([SAFE, UNSAFE, SAFE2]))
    assert [r.status for r in first] == ["released", "released"]
    assert [r.status for r in withheld] == ["released", "withheld"]
    return Audited(
        service=service,
        url=srv.url,
        db=centre.root / "safeaccess.db",
        auditor_key=_pem(auditor, work / "eve.key"),
        server_pub=server_pub,
        ada_key=_pem(centre.keys["ada"], work / "ada.key"),
        released=first[1],
        work=work,
    )


def _verify_cli(a: Audited, *extra: str) -> int:
    return client_main(
        [
            "audit",
            "verify",
            "--server",
            a.url,
            "--key",
            str(a.auditor_key),
            "--auditor",
            "eve",
            "--server-key",
            str(a.server_pub),
            *extra,
        ]
    )


def _export(a: Audited, name: str) -> Path:
    out = a.work / name
    args = ["audit", "export", "--server", a.url, "--key", str(a.auditor_key)]
    code = client_main([*args, "--auditor", "eve", "--out", str(out)])
    assert code == 0
    return out


@contextmanager
def tampered(db: Path) -> Iterator[sqlite3.Connection]:
    """A direct connection to the live database; everything is restored afterwards."""
    live = sqlite3.connect(db, timeout=30)
    snapshot = sqlite3.connect(":memory:")
    live.backup(snapshot)
    try:
        yield live
        live.commit()
    finally:
        snapshot.backup(live)
        live.close()
        snapshot.close()


def _index_of(conn: sqlite3.Connection, kind: str) -> int:
    row = conn.execute(
        "SELECT log_index FROM events WHERE kind = ? ORDER BY log_index LIMIT 1", (kind,)
    ).fetchone()
    return int(row[0])


def _fails_at(
    a: Audited, capsys: pytest.CaptureFixture[str], entry: int | None, *extra: str
) -> str:
    capsys.readouterr()
    assert _verify_cli(a, *extra) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    if entry is not None:
        assert f"FAILED: entry {entry}:" in out, out
    return out


# -- the honest log -----------------------------------------------------------------------------


def test_the_log_verifies_through_the_server_and_offline(
    audited: Audited, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert _verify_cli(audited) == 0
    out = capsys.readouterr().out
    assert "OK: the log verifies" in out
    assert "sequences: 2 replayed" in out and "3 released, 1 withheld" in out
    export = _export(audited, "honest.export")
    assert client_main(["audit", "verify", "--export", str(export)]) == 0
    # The records hold the facts and commitments, never the outputs themselves.
    text = export.read_text()
    assert "output_sha256" not in text and '"values":' not in text
    assert '"output_commitment":"' in text and '"counts":' in text


def test_auditors_and_researchers_cannot_use_each_others_endpoints(
    audited: Audited, centre: Centre
) -> None:
    eve = serialization.load_pem_private_key(audited.auditor_key.read_bytes(), None)
    assert isinstance(eve, Ed25519PrivateKey)
    as_researcher = signed(audited.url, eve, "eve", "GET", "/v1/sequences")
    assert as_researcher.status_code == 401
    as_auditor = signed(audited.url, centre.keys["ada"], "ada", "GET", "/v1/audit/checkpoint")
    assert as_auditor.status_code == 401
    assert signed(audited.url, eve, "eve", "GET", "/v1/audit/checkpoint").status_code == 200


def test_auditor_authentication_failures_do_not_say_whether_the_auditor_exists(
    audited: Audited,
) -> None:
    # An unknown auditor name and a known name signed with the wrong key: one answer, so the
    # audit endpoints cannot be used to learn who holds an auditor account.
    stranger = Ed25519PrivateKey.generate()
    unknown = signed(audited.url, stranger, "nobody", "GET", "/v1/audit/checkpoint")
    wrong_key = signed(audited.url, stranger, "eve", "GET", "/v1/audit/checkpoint")
    assert unknown.status_code == wrong_key.status_code == 401
    assert unknown.json() == wrong_key.json()


def test_a_researcher_checks_her_receipt_against_the_log(
    audited: Audited, capsys: pytest.CaptureFixture[str]
) -> None:
    step = audited.released
    file = audited.work / "receipt.json"
    file.write_text(json.dumps({"receipt": step.receipt, "output": step.output}))
    args = ["audit", "receipt", str(file), "--server", audited.url]
    args += ["--key", str(audited.ada_key), "--researcher", "ada"]
    capsys.readouterr()
    assert client_main(args) == 0
    assert "the log commits to exactly your output" in capsys.readouterr().out
    # Swap the released output in the database: the receipt check names the log entry.
    assert step.receipt is not None
    entry = step.receipt["fields"]["log_index"]
    with tampered(audited.db) as conn:
        other = json.dumps(dict(step.output or {}, values=[[1.0], [2.0]]))
        conn.execute(
            'UPDATE steps SET public_output = ? WHERE sequence_id = ? AND "index" = ?',
            (other, step.sequence_id, step.index),
        )
        conn.commit()
        assert client_main(args) == 1
        out = capsys.readouterr().out
        assert f"FAILED: entry {entry}:" in out and "swapped" in out
    # A receipt whose output was altered does not open the commitment either.
    file.write_text(json.dumps({"receipt": step.receipt, "output": {"values": [[0]]}}))
    assert client_main(args) == 1
    assert "does not open" in capsys.readouterr().out


# -- tampering ----------------------------------------------------------------------------------


def test_an_edited_row_is_named(audited: Audited, capsys: pytest.CaptureFixture[str]) -> None:
    with tampered(audited.db) as conn:
        index = _index_of(conn, "checks")
        (record,) = conn.execute(
            "SELECT record FROM events WHERE log_index = ?", (index,)
        ).fetchone()
        edited = bytes(record).replace(b'"verdict":"release"', b'"verdict":"review"', 1)
        assert edited != bytes(record)
        conn.execute("UPDATE events SET record = ? WHERE log_index = ?", (edited, index))
        conn.commit()
        out = _fails_at(audited, capsys, index)
        assert "not included" in out


def test_a_deleted_row_is_named(audited: Audited, capsys: pytest.CaptureFixture[str]) -> None:
    with tampered(audited.db) as conn:
        for kind in ("step_withheld", "checks"):  # the last entry, and one in the middle
            index = _index_of(conn, kind)
            conn.execute("DELETE FROM events WHERE log_index = ?", (index,))
            conn.commit()
            assert "missing" in _fails_at(audited, capsys, index)


@pytest.mark.parametrize("kind", ["step_withheld", "checks"])  # the last entry; the middle
def test_an_inserted_row_is_named(
    audited: Audited, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    with tampered(audited.db) as conn:
        index = _index_of(conn, kind)
        rows = conn.execute(
            "SELECT id, log_index FROM events WHERE log_index >= ? ORDER BY log_index DESC",
            (index,),
        ).fetchall()
        for row_id, log_index in rows:
            conn.execute("UPDATE events SET log_index = ? WHERE id = ?", (log_index + 1, row_id))
        (record,) = conn.execute(
            "SELECT record FROM events WHERE log_index = ?", (index + 1,)
        ).fetchone()
        forged = json.loads(record)
        forged.update(kind="step_released", index=index)
        conn.execute(
            "INSERT INTO events (log_index, at, kind, actor, record) VALUES (?, ?, ?, ?, ?)",
            (index, "2026-01-01", "step_released", "server", encode_record(forged)),
        )
        conn.commit()
        out = _fails_at(audited, capsys, index)
        # Named where it is, and as a row the server did not write: it holds no Merkle hashes,
        # so the server cannot sign a tree over it.
        assert f"FAILED: entry {index}: not written by the server" in out, out
        assert "inserted or edited" in out, out


def test_reordered_rows_are_named(audited: Audited, capsys: pytest.CaptureFixture[str]) -> None:
    with tampered(audited.db) as conn:
        index = _index_of(conn, "run_finished")
        conn.execute("UPDATE events SET log_index = -1 WHERE log_index = ?", (index,))
        conn.execute("UPDATE events SET log_index = ? WHERE log_index = ?", (index, index + 1))
        conn.execute("UPDATE events SET log_index = ? WHERE log_index = -1", (index + 1,))
        conn.commit()
        assert "moved" in _fails_at(audited, capsys, index)


def _rewrite_tail(conn: sqlite3.Connection, keep: int) -> None:
    """Truncate the log to `keep` entries, the way an insider would: rows (with the Merkle nodes
    they keep) and size."""
    conn.execute("DELETE FROM events WHERE log_index >= ?", (keep,))
    conn.execute("UPDATE audit_head SET size = ?", (keep,))
    conn.commit()


def test_truncating_and_growing_the_log_is_caught(
    audited: Audited, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _export(audited, "before-truncation.export")
    note = audited.work / "trusted.checkpoint"
    note.write_text(ExportSource(before).checkpoint_note)
    with tampered(audited.db) as conn:
        keep = _index_of(conn, "step_withheld")
        _rewrite_tail(conn, keep)
        # Grow it again through the store: the new log is internally consistent ...
        for name in ("x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8"):
            audited.service.store.add_project(name)
        capsys.readouterr()
        assert _verify_cli(audited) == 0
        # ... but not with what the auditor trusted before: the first rewritten entry is named.
        out = _fails_at(audited, capsys, keep, "--trusted-checkpoint", str(before))
        assert "inconsistent with the trusted checkpoint" in out
        out = _fails_at(audited, capsys, None, "--trusted-checkpoint", str(note))
        assert "history was rewritten" in out or "inconsistent" in out


def test_a_checkpoint_signed_with_another_key_is_refused(
    audited: Audited, capsys: pytest.CaptureFixture[str]
) -> None:
    export = _export(audited, "forge.export")
    source = ExportSource(export)
    lines = source.checkpoint_note.split("\n")
    checkpoint = Checkpoint(
        origin=lines[0], size=int(lines[1]), root=base64.b64decode(lines[2]), time=int(time.time())
    )
    forged = sign_checkpoint(checkpoint, audited.service.server_id, Ed25519PrivateKey.generate())
    note = audited.work / "forged.checkpoint"
    note.write_text(forged)
    out = _fails_at(audited, capsys, None, "--trusted-checkpoint", str(note))
    assert "not signed by" in out
    # An export whose header carries a forged checkpoint fails too (with the centre's key pinned).
    header, rest = export.read_bytes().split(b"\n", 1)
    meta = json.loads(header)
    meta["checkpoint"] = forged
    bad = audited.work / "forged.export"
    bad.write_bytes(json.dumps(meta).encode() + b"\n" + rest)
    capsys.readouterr()
    code = client_main(
        ["audit", "verify", "--export", str(bad), "--server-key", str(audited.server_pub)]
    )
    assert code == 1 and "FAILED: checkpoint" in capsys.readouterr().out


def test_a_checkpoint_of_a_forked_log_is_caught(
    audited: Audited, capsys: pytest.CaptureFixture[str]
) -> None:
    """The centre signs two histories (showing another auditor a log where a withhold never
    happened): holding the fork's checkpoint, the verifier names the first entry that differs."""
    export = _export(audited, "fork-base.export")
    source = ExportSource(export)
    entries = list(source.entries(0))
    fork_at = next(i for i, r, _ in entries if decode_record(r).kind == "step_withheld")
    records = [r for _, r, _ in entries]
    changed = json.loads(records[fork_at])
    changed["kind"] = "step_released"
    records[fork_at] = encode_record(changed)
    root = root_of([leaf_hash(r) for r in records])
    fork = sign_checkpoint(
        Checkpoint(source.checkpoint_note.split("\n")[0], len(records), root, int(time.time())),
        audited.service.server_id,
        audited.service.signing_key,
    )
    header = json.loads(export.read_text().split("\n", 1)[0])
    header["checkpoint"] = fork
    forked = audited.work / "fork.export"
    lines = [json.dumps(header)] + [
        f"{i} {base64.b64encode(leaf_hash(r)).decode()} {r.decode()}" for i, r in enumerate(records)
    ]
    forked.write_text("\n".join(lines) + "\n")
    out = _fails_at(audited, capsys, fork_at, "--trusted-checkpoint", str(forked))
    assert "inconsistent with the trusted checkpoint" in out


def test_a_release_the_logged_rules_would_withhold_is_flagged(audited: Audited) -> None:
    """A dishonest centre that releases despite its rules, and logs (and signs) honestly what
    the checks saw: the verifier re-derives the decision and names the release."""
    source = ExportSource(_export(audited, "rules.export"))
    records = [r for _, r, _ in source.entries(0)]
    parsed = [json.loads(r) for r in records]
    checks_at = next(i for i, p in enumerate(parsed) if p["kind"] == "checks")
    released_at = next(
        i for i, p in enumerate(parsed) if i > checks_at and p["kind"] == "step_released"
    )
    parsed[checks_at]["data"]["facts"]["counts"][0][0] = 3  # below the threshold of 10
    records = [encode_record(p) for p in parsed]
    source.checkpoint_note = sign_checkpoint(
        Checkpoint(
            source.checkpoint_note.split("\n")[0],
            len(records),
            root_of([leaf_hash(r) for r in records]),
            int(time.time()),
        ),
        audited.service.server_id,
        audited.service.signing_key,
    )
    source.entries = lambda size: iter((i, r, None) for i, r in enumerate(records))  # type: ignore[method-assign]
    with pytest.raises(AuditFailure) as info:
        verify_log(source)
    assert info.value.entry == released_at
    assert "below the threshold 10" in str(info.value)


# -- crash safety -------------------------------------------------------------------------------

_APPENDER = """
import sys
from safeaccess.server.store import Store
store = Store(sys.argv[1])
i = 0
while True:
    store.log_event("crash_test", "crash-test", {"i": i, "pad": "x" * 2000})
    if i == 0:
        print("appending", flush=True)
    i += 1
"""


def test_a_process_killed_mid_append_leaves_a_log_that_verifies(
    centre: Centre, tmp_path: Path
) -> None:
    import shutil

    from safeaccess.server.auditors import AuditService

    root = tmp_path / "copy"
    shutil.copytree(centre.root, root)
    url = f"sqlite:///{root / 'safeaccess.db'}"
    for attempt in range(5):
        proc = subprocess.Popen([sys.executable, "-c", _APPENDER, url], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"appending\n"
        time.sleep(0.2 + 0.13 * attempt)  # appending continuously: the kill lands mid-write
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    service = Service(root)
    try:
        export = tmp_path / "after-kill.export"
        export.write_bytes(b"".join(AuditService.of(service).export()))
        report = verify_log(ExportSource(export))
        assert report.kinds.get("crash_test", 0) > 10
    finally:
        service.close()


def _resigned(
    audited: Audited, name: str, mutate: Any
) -> tuple[ExportSource, list[dict[str, Any]]]:
    """The honest export's records after `mutate(records)`, renumbered, in a tree the centre
    signs: what a dishonest centre could publish. The verifier must catch it by replaying."""
    source = ExportSource(_export(audited, name))
    parsed = [json.loads(r) for _, r, _ in source.entries(0)]
    mutate(parsed)
    for i, p in enumerate(parsed):
        p["index"] = i
    records = [encode_record(p) for p in parsed]
    source.checkpoint_note = sign_checkpoint(
        Checkpoint(
            source.checkpoint_note.split("\n")[0],
            len(records),
            root_of([leaf_hash(r) for r in records]),
            int(time.time()),
        ),
        audited.service.server_id,
        audited.service.signing_key,
    )
    source.entries = lambda size: iter((i, r, None) for i, r in enumerate(records))  # type: ignore[method-assign]
    return source, parsed


def test_a_step_run_after_a_withhold_is_flagged(audited: Audited) -> None:
    def run_after_withhold(parsed: list[dict[str, Any]]) -> None:
        at = next(i for i, p in enumerate(parsed) if p["kind"] == "step_withheld")
        reveal = next(
            p
            for p in parsed
            if p["kind"] == "step_revealed"
            and p["step"] == 2
            and p["sequence"] == parsed[at]["sequence"]
        )
        parsed.insert(at + 1, dict(reveal, step=3))

    source, parsed = _resigned(audited, "after-withhold.export", run_after_withhold)
    with pytest.raises(AuditFailure) as info:
        verify_log(source)
    bad = next(i for i, p in enumerate(parsed) if p["kind"] == "step_withheld") + 1
    assert info.value.entry == bad and "while the sequence was closed" in str(info.value)


def test_a_step_revealed_before_the_previous_release_is_flagged(audited: Audited) -> None:
    def reveal_early(parsed: list[dict[str, Any]]) -> None:
        released = next(i for i, p in enumerate(parsed) if p["kind"] == "step_released")
        second = next(
            i
            for i, p in enumerate(parsed)
            if p["kind"] == "step_revealed"
            and p["step"] == 2
            and p["sequence"] == parsed[released]["sequence"]
        )
        parsed.insert(released, parsed.pop(second))

    source, parsed = _resigned(audited, "early.export", reveal_early)
    with pytest.raises(AuditFailure) as info:
        verify_log(source)
    assert parsed[info.value.entry or 0]["kind"] == "step_revealed"
    assert "tit-for-tat" in str(info.value)


def test_a_researcher_gets_proofs_for_her_own_steps_only(audited: Audited, centre: Centre) -> None:
    step = audited.released
    path = f"/v1/sequences/{step.sequence_id}/steps/{step.index}/proof"
    mine = signed(audited.url, centre.keys["ada"], "ada", "GET", path)
    assert mine.status_code == 200 and mine.json()["index"] == step.receipt["fields"]["log_index"]  # type: ignore[index]
    theirs = signed(audited.url, centre.keys["bob"], "bob", "GET", path)
    assert theirs.status_code == 404


# -- scripts --------------------------------------------------------------------------------------


def test_an_honest_log_with_an_approved_script_step_verifies(
    audited: Audited, centre: Centre, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script step is logged as queued (no verdict yet), sent to review, then its run's
    verdict arrives in `script_run_finished`: the honest sequence of records verifies."""
    sealed = centre.seal([Script(code="result = 1"), SAFE])
    with connect(audited.url, centre.keys["ada"], "ada") as session:
        results = session.run(sealed)
        assert [r.status for r in results] == ["review"]
        assert audited.service.scripts.wait_idle(120)
        review.decide(
            audited.service.store, results[0].sequence_id, 1, approve=True, reviewer="checker"
        )
        assert [r.status for r in session.run(sealed)] == ["released", "released"]
    capsys.readouterr()
    assert _verify_cli(audited) == 0, capsys.readouterr().out
    assert "OK: the log verifies" in capsys.readouterr().out


# -- receipts of withheld steps -----------------------------------------------------------------


def test_a_researcher_proves_a_withhold_with_her_receipt(
    audited: Audited, centre: Centre, capsys: pytest.CaptureFixture[str]
) -> None:
    """The log commits to the withheld output (hidden, no opening is given); her signed receipt
    carries the same commitment, so `audit receipt` proves the withhold against the log."""
    with connect(audited.url, centre.keys["ada"], "ada") as session:
        (step,) = session.run(centre.seal([UNSAFE]))
    assert step.status == "withheld" and step.receipt is not None
    assert step.receipt["fields"]["output_opening"] is None  # nothing of the output leaks
    file = audited.work / "withheld-receipt.json"
    file.write_text(json.dumps({"receipt": step.receipt, "output": None}))
    args = ["audit", "receipt", str(file), "--server", audited.url]
    args += ["--key", str(audited.ada_key), "--researcher", "ada"]
    capsys.readouterr()
    assert client_main(args) == 0, capsys.readouterr().out
    assert "withheld" in capsys.readouterr().out
    # A receipt that claims a release of this withheld entry is refused.
    fields = dict(step.receipt["fields"], state="released")
    forged = {"fields": fields, "signature": step.receipt["signature"]}
    file.write_text(json.dumps({"receipt": forged, "output": None}))
    assert client_main(args) == 1


# -- researcher keys ----------------------------------------------------------------------------


def _second_registration(key_text: str | None) -> Any:
    """A mutation appending a second `researcher_added` for ada (with `key_text`, or her own)."""

    def mutate(parsed: list[dict[str, Any]]) -> None:
        first = next(
            p
            for p in parsed
            if p["kind"] == "researcher_added" and p["data"]["researcher"] == "ada"
        )
        data = dict(first["data"])
        if key_text is not None:
            data["public_key"] = key_text
            data["fingerprint"] = "forged"
        parsed.append(dict(first, data=data))

    return mutate


def test_a_second_registration_with_another_key_is_refused(audited: Audited) -> None:
    """An operator who appends `researcher_added` for ada with his own key could sign sequences
    in her name: the verifier refuses the entry (a key changes only by a signed event)."""
    forged_key = public_key_text(Ed25519PrivateKey.generate().public_key())
    source, parsed = _resigned(audited, "rekeyed.export", _second_registration(forged_key))
    with pytest.raises(AuditFailure) as info:
        verify_log(source)
    assert info.value.entry == len(parsed) - 1
    assert "ada" in str(info.value) and "another key" in str(info.value)
    # Registering her again with her own key (a project added) is honest and verifies.
    source, _ = _resigned(audited, "readded.export", _second_registration(None))
    verify_log(source)


# -- required claims ----------------------------------------------------------------------------


def test_a_step_run_without_a_required_claim_is_named(audited: Audited) -> None:
    """The server refuses, and does not log, a step whose kind needs a claim no endorsement of
    the sequence grants; a log where one ran anyway names that step's decision."""

    def require_before_first_open(parsed: list[dict[str, Any]]) -> None:
        opened = next(i for i, p in enumerate(parsed) if p["kind"] == "sequence_opened")
        claim = {"dataset": "census", "kind": "frequency_table", "claim": "fair"}
        parsed.insert(
            opened,
            dict(parsed[opened], kind="claim_required", sequence=None, step=None, data=claim),
        )

    source, parsed = _resigned(audited, "claims.export", require_before_first_open)
    with pytest.raises(AuditFailure) as info:
        verify_log(source)
    assert parsed[info.value.entry or 0]["kind"] == "checks"
    assert "requires the claim(s) fair" in str(info.value), info.value
