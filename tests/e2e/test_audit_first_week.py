"""Issue 41, point 4: the log of a centre set up in the order of docs/server.md's first week
verifies. A researcher rotates her key on day 2, before the first `serve` has logged the
centre's configuration: the verifier checks that rotation against the server id of the log's
signed checkpoint, as the server checked it. Real CLIs (admin and client), a real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import resigned_log

from safeaccess.client.analyses import FrequencyTable
from safeaccess.client.audit.verify import AuditFailure, verify_log
from safeaccess.client.cli import main as client_main
from safeaccess.client.keyrotation import sign_rotation
from safeaccess.client.keys import load_private_key
from safeaccess.client.session import connect
from safeaccess.server.admin.cli import main as server_main
from safeaccess.server.config import DataDir
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service


def _keys(name: str, where: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    assert client_main(["keys", "new", name, "--dir", str(where)]) == 0
    capsys.readouterr()
    return where / f"{name}.key", where / f"{name}.pub"


def test_a_rotation_before_the_first_serve_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "sac"
    d = ["--data-dir", str(root)]
    # Day 1: the centre.
    assert server_main(["init", *d, "--server-id", "first-week"]) == 0
    assert server_main(["key", "show", *d]) == 0
    (tmp_path / "centre.pub").write_text(capsys.readouterr().out)
    # Day 2: people; bob rotates his key before the centre serves (a new laptop, say).
    bob_old, bob_old_pub = _keys("bob", tmp_path / "old", capsys)
    bob_new, bob_new_pub = _keys("bob", tmp_path / "new", capsys)
    eve, eve_pub = _keys("eve", tmp_path, capsys)
    assert server_main(["project", "add", "health", *d]) == 0
    assert (
        server_main(
            [
                "researcher",
                "add",
                "bob",
                "--public-key",
                str(bob_old_pub),
                "--project",
                "health",
                *d,
            ]
        )
        == 0
    )
    assert server_main(["auditor", "add", "eve", "--public-key", str(eve_pub), *d]) == 0
    capsys.readouterr()
    rotation = [
        "keys", "sign-rotation", "--key", str(bob_old), "--new-public-key", str(bob_new_pub),
        "--researcher", "bob", "--server-id", "first-week",
    ]  # fmt: skip
    assert client_main(rotation) == 0
    signature = capsys.readouterr().out.strip()
    assert server_main(
        ["researcher", "rotate-key", "bob", "--public-key", str(bob_new_pub),
         "--signature", signature, *d]
    ) == 0  # fmt: skip
    # Day 3: data.
    generate_census(400, seed=3).to_csv(tmp_path / "census.csv", index=False)
    (tmp_path / "census.json").write_text(json.dumps(census_metadata().model_dump(mode="json")))
    add = ["dataset", "add", "census", "--data", str(tmp_path / "census.csv")]
    assert (
        server_main([*add, "--metadata", str(tmp_path / "census.json"), "--project", "health", *d])
        == 0
    )
    assert DataDir(root).load_config().server_id == "first-week"
    # Day 4: serve; bob works with his new key; the auditor verifies the log.
    with Service(root) as service, EmbeddedServer(create_app(service)) as srv:
        with connect(srv.url, load_private_key(bob_new), "bob") as session:
            plan = session.plan("census").add(FrequencyTable(rows=["sex"]))
            assert [r.released for r in session.run(session.seal(plan))] == [True]
        capsys.readouterr()
        verify = [
            "audit", "verify", "--server", srv.url, "--key", str(eve), "--auditor", "eve",
            "--server-key", str(tmp_path / "centre.pub"),
        ]  # fmt: skip
        assert client_main(verify) == 0, capsys.readouterr().out
        out = capsys.readouterr().out
        assert "researcher bob rotated her key (signed by the previous one)" in out

        # Still checked: the same rotation signed by another key, in a log the centre re-signs.
        def forged(parsed: list[dict[str, Any]]) -> None:
            rotated = next(p for p in parsed if p["kind"] == "researcher_key_rotated")
            rotated["data"]["signature"] = sign_rotation(
                Ed25519PrivateKey.generate(),
                "first-week",
                "bob",
                rotated["data"]["old_fingerprint"],
                rotated["data"]["public_key"],
            )

        with pytest.raises(AuditFailure) as info:
            verify_log(resigned_log(service, tmp_path / "forged.export", forged))
    assert "the rotation of the key of researcher 'bob' is not signed by her previous key" in str(
        info.value
    )
