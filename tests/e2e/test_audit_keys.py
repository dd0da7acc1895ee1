"""Issue 26, point 2: a researcher's key changes only by a signed rotation (her old key's
signature) or the centre's revocation (with a reason, flagged by her client at her next
connection); the verifier keeps each researcher's key history and checks every sequence and step
against the key valid at its time. Real server, real client, real CLIs, real logs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Centre

from safeaccess.client.analyses import FrequencyTable
from safeaccess.client.audit.checkpoint import Checkpoint, sign_checkpoint
from safeaccess.client.audit.merkle import leaf_hash, root_of
from safeaccess.client.audit.records import encode_record
from safeaccess.client.audit.verify import AuditFailure, ExportSource, Report, verify_log
from safeaccess.client.cli import main as client_main
from safeaccess.client.keyrotation import sign_rotation
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.client.session import KeyReplaced, ServerError, connect
from safeaccess.server.admin.accounts import remove_researcher
from safeaccess.server.admin.cli import main as server_main
from safeaccess.server.auditors import AuditService
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service

SAFE = FrequencyTable(rows=["sex"])
SAFE2 = FrequencyTable(rows=["region"])


def _write_private(key: Ed25519PrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


def _write_public(key: Ed25519PrivateKey, path: Path) -> Path:
    path.write_text(public_key_text(key.public_key()))
    return path


def _export(service: Service, path: Path) -> ExportSource:
    path.write_bytes(b"".join(AuditService.of(service).export()))
    return ExportSource(path)


def _resigned(
    service: Service, path: Path, mutate: Any
) -> tuple[ExportSource, list[dict[str, Any]]]:
    """The honest log after `mutate(records)`, renumbered and in a tree the centre signs: what a
    dishonest centre could publish. Only replaying the records can catch it."""
    source = _export(service, path)
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
        service.server_id,
        service.signing_key,
    )
    source.entries = lambda size: iter((i, r, None) for i, r in enumerate(records))  # type: ignore[method-assign]
    return source, parsed


def _rotate_cli(centre: Centre, name: str, signature: str, public: Path) -> int:
    return server_main(
        [
            "researcher",
            "rotate-key",
            name,
            "--data-dir",
            str(centre.root),
            "--public-key",
            str(public),
            "--signature",
            signature,
        ]
    )


def test_a_signed_rotation_replaces_the_key_and_old_sequences_stop(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    service, srv = server
    old = centre.keys["bob"]
    new = Ed25519PrivateKey.generate()
    with connect(srv.url, old, "bob") as session:
        pending = centre.seal([SAFE, SAFE2], researcher="bob")
        first = session.open(pending)
        assert first.status == "released"

    # A signature by any key other than her current one is refused, and nothing changes.
    forged = sign_rotation(
        Ed25519PrivateKey.generate(),
        centre.server_id,
        "bob",
        fingerprint(old),
        public_key_text(new.public_key()),
    )
    size = len(list(_export(service, tmp_path / "before.export").entries(0)))
    assert _rotate_cli(centre, "bob", forged, _write_public(new, tmp_path / "new.pub")) == 2
    assert "not signed by bob's current key" in capsys.readouterr().err
    assert len(list(_export(service, tmp_path / "after.export").entries(0))) == size
    with connect(srv.url, old, "bob") as session:
        assert session.datasets()  # still her key

    # Her own client signs the rotation with the old key; the operator applies it.
    capsys.readouterr()
    assert (
        client_main(
            [
                "keys",
                "sign-rotation",
                "--key",
                str(_write_private(old, tmp_path / "old.key")),
                "--new-public-key",
                str(tmp_path / "new.pub"),
                "--researcher",
                "bob",
                "--server-id",
                centre.server_id,
            ]
        )
        == 0
    )
    signature = capsys.readouterr().out.strip()
    assert _rotate_cli(centre, "bob", signature, tmp_path / "new.pub") == 0
    centre.keys["bob"] = new

    # The old key no longer signs in, and her client says why.
    with connect(srv.url, old, "bob") as session, pytest.raises(KeyReplaced) as replaced:
        session.datasets()
    assert replaced.value.code == "key_rotated" and "REVOKED" not in str(replaced.value)
    # A sequence signed with the old key accepts no further step, even signed in with the new.
    with connect(srv.url, new, "bob") as session:
        with pytest.raises(ServerError) as refused:
            session.reveal(first.sequence_id, pending, 2)
        assert refused.value.status == 422 and "signed by another key" in str(refused.value)
        assert [r.status for r in session.run(centre.seal([SAFE], researcher="bob"))] == [
            "released"
        ]

    report = verify_log(_export(service, tmp_path / "rotated.export"))
    assert any("bob rotated her key" in note for note in report.notes), report.notes

    # A log where the old sequence's step 2 was revealed after the rotation is caught.
    def reveal_after_rotation(parsed: list[dict[str, Any]]) -> None:
        step1 = next(
            p for p in parsed if p["kind"] == "step_revealed" and p["sequence"] == first.sequence_id
        )
        parsed.append(dict(step1, step=2))

    source, parsed = _resigned(service, tmp_path / "late.export", reveal_after_rotation)
    with pytest.raises(AuditFailure) as info:
        verify_log(source)
    assert info.value.entry == len(parsed) - 1
    assert "after the key of 'bob' that signed its sequence was replaced" in str(info.value)


def test_a_forged_rotation_in_the_log_is_refused(
    centre: Centre, server: tuple[Service, EmbeddedServer], tmp_path: Path
) -> None:
    """The operator appends a rotation of ada's key to his own, signed by himself (not by her
    old key): he could then sign sequences as her. The verifier refuses that entry."""
    service, _ = server
    operator = Ed25519PrivateKey.generate()
    ada = centre.keys["ada"]

    def forge(parsed: list[dict[str, Any]]) -> None:
        added = next(
            p
            for p in parsed
            if p["kind"] == "researcher_added" and p["data"]["researcher"] == "ada"
        )
        text = public_key_text(operator.public_key())
        data = {
            "researcher": "ada",
            "old_fingerprint": fingerprint(ada),
            "fingerprint": fingerprint(operator),
            "public_key": text,
            "signature": sign_rotation(operator, centre.server_id, "ada", fingerprint(ada), text),
        }
        parsed.append(dict(added, kind="researcher_key_rotated", data=data))

    source, parsed = _resigned(service, tmp_path / "forged.export", forge)
    with pytest.raises(AuditFailure) as info:
        verify_log(source)
    assert info.value.entry == len(parsed) - 1
    assert "not signed by her previous key" in str(info.value)

    def unexplained(parsed: list[dict[str, Any]]) -> None:
        forge(parsed)
        record = parsed[-1]
        data = {k: v for k, v in record["data"].items() if k != "signature"}
        parsed[-1] = dict(record, kind="researcher_key_revoked", data=dict(data, reason=" "))

    source, parsed = _resigned(service, tmp_path / "unexplained.export", unexplained)
    with pytest.raises(AuditFailure) as info:
        verify_log(source)
    assert info.value.entry == len(parsed) - 1 and "gives no reason" in str(info.value)


def test_a_revocation_by_the_centre_is_flagged_to_her_and_to_auditors(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    service, srv = server
    old = centre.keys["carol"]
    new = Ed25519PrivateKey.generate()
    args = ["researcher", "revoke-key", "carol", "--data-dir", str(centre.root)]
    public = str(_write_public(new, tmp_path / "carol-new.pub"))
    # No reason: refused, nothing changes.
    assert server_main([*args, "--public-key", public, "--reason", "  "]) == 2
    with connect(srv.url, old, "carol") as session:
        assert session.datasets()
    assert server_main([*args, "--public-key", public, "--reason", "laptop stolen"]) == 0
    with connect(srv.url, old, "carol") as session, pytest.raises(KeyReplaced) as flagged:
        session.datasets()
    message = str(flagged.value)
    assert flagged.value.code == "key_revoked"
    assert "REVOKED" in message and "laptop stolen" in message and "report it" in message
    with connect(srv.url, new, "carol") as session:
        assert session.datasets()
    report: Report = verify_log(_export(service, tmp_path / "revoked.export"))
    assert any("REVOKED researcher carol" in n and "laptop stolen" in n for n in report.notes)


def test_a_removal_frees_a_name_only_without_sequences(
    centre: Centre, server: tuple[Service, EmbeddedServer], tmp_path: Path
) -> None:
    """An honest centre may remove a researcher who never opened a sequence and register the
    name again with another key: that log verifies. A removal of one with sequences (which the
    server refuses), followed by a registration with the operator's key, is caught."""
    service, _ = server
    first, second = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    store = service.store
    store.add_researcher("dora", public_key_text(first), fingerprint(first), ["p1"])
    remove_researcher(store, "dora")
    store.add_researcher("dora", public_key_text(second), fingerprint(second), ["p1"])
    report = verify_log(_export(service, tmp_path / "dora.export"))
    assert any("researcher dora was removed" in note for note in report.notes)
    # Her old key's client is told her account was removed and the name may be another's.
    with connect(server[1].url, first, "dora") as session, pytest.raises(KeyReplaced) as gone:
        session.datasets()
    assert gone.value.code == "key_removed" and "REMOVED" in str(gone.value)

    with connect(server[1].url, centre.keys["ada"], "ada") as session:
        assert [r.status for r in session.run(centre.seal([SAFE]))] == ["released"]
    operator = Ed25519PrivateKey.generate()

    def remove_and_replace_ada(parsed: list[dict[str, Any]]) -> None:
        added = next(
            p
            for p in parsed
            if p["kind"] == "researcher_added" and p["data"]["researcher"] == "ada"
        )
        parsed.append(
            dict(added, kind="researcher_removed", data={"researcher": "ada", "projects": ["p1"]})
        )
        data = dict(added["data"], public_key=public_key_text(operator))
        parsed.append(dict(added, data=dict(data, fingerprint=fingerprint(operator))))

    source, parsed = _resigned(service, tmp_path / "replaced.export", remove_and_replace_ada)
    with pytest.raises(AuditFailure) as info:
        verify_log(source)
    assert info.value.entry == len(parsed) - 2
    assert "removed although she has sequences on record" in str(info.value)
