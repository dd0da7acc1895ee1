"""Keys: creation with safe permissions, loading, fingerprints; and the `safeaccess keys` CLI."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key

from safeaccess.client import keys
from safeaccess.client.cli import main
from safeaccess.client.keys import (
    KeyExistsError,
    KeyFileError,
    default_key_dir,
    fingerprint,
    generate_keypair,
    load_private_key,
    load_public_key,
    public_key_raw,
    public_key_text,
)

# DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): the raw key is the 32 bytes after it.
SPKI_ED25519_PREFIX = bytes.fromhex("302a300506032b6570032100")


@pytest.fixture
def umask_zero() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _raw_from_pem(pem: str) -> bytes:
    body = "".join(line for line in pem.splitlines() if not line.startswith("-----"))
    der = base64.b64decode(body)
    assert der[:12] == SPKI_ED25519_PREFIX and len(der) == 44
    return der[12:]


def test_generate_keypair_modes_and_round_trip(tmp_path: Path, umask_zero: None) -> None:
    private_path, public_path = generate_keypair("alice", tmp_path / "keys")
    assert (private_path.name, public_path.name) == ("alice.key", "alice.pub")
    # Even with umask 0 the secret is created owner-only.
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(public_path.stat().st_mode) == 0o644
    assert stat.S_IMODE(private_path.parent.stat().st_mode) == 0o700
    private = load_private_key(private_path)
    public = load_public_key(public_path)
    signature = private.sign(b"message")
    public.verify(signature, b"message")  # raises if the pair does not match
    assert load_public_key(private_path).public_bytes_raw() == public.public_bytes_raw()


def test_private_key_is_created_with_its_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The mode must be set when the file is created, never by a chmod afterwards.
    def no_chmod(*args: object, **kwargs: object) -> None:
        raise AssertionError("chmod after creation")

    modes: list[int] = []
    real_open = os.open

    def recording_open(path: str, flags: int, mode: int = 0o777, **kw: object) -> int:
        modes.append(mode)
        assert flags & os.O_EXCL
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(os, "fchmod", no_chmod)
    monkeypatch.setattr(keys.os, "open", recording_open)
    generate_keypair("bob", tmp_path)
    assert modes[0] == 0o600


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    private_path, public_path = generate_keypair("alice", tmp_path)
    before = private_path.read_bytes()
    with pytest.raises(KeyExistsError, match="refusing to overwrite"):
        generate_keypair("alice", tmp_path)
    assert private_path.read_bytes() == before
    public_path.unlink()  # half a pair left: still refuse, and keep the private key
    with pytest.raises(KeyExistsError):
        generate_keypair("alice", tmp_path)
    assert private_path.read_bytes() == before


@pytest.mark.parametrize("name", ["", "../evil", "a/b", ".hidden", "x.key", "x" * 65, "a b"])
def test_bad_key_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(KeyFileError):
        generate_keypair(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_fingerprint_is_sha256_of_raw_key(tmp_path: Path) -> None:
    _, public_path = generate_keypair("alice", tmp_path)
    pem = public_path.read_text()
    raw = _raw_from_pem(pem)  # decoded by hand from the DER, not through cryptography
    key = load_public_key(public_path)
    assert public_key_raw(key) == raw
    assert fingerprint(key) == hashlib.sha256(raw).hexdigest()
    assert public_key_text(key) == pem


def test_load_from_bytes_and_errors(tmp_path: Path) -> None:
    private_path, public_path = generate_keypair("alice", tmp_path)
    assert load_private_key(private_path.read_bytes()).public_key() == load_public_key(
        public_path.read_bytes()
    )
    with pytest.raises(KeyFileError, match="not found"):
        load_private_key(tmp_path / "missing.key")
    with pytest.raises(KeyFileError):
        load_public_key(b"garbage")
    with pytest.raises(KeyFileError):
        load_private_key(public_path)
    ec = generate_private_key(SECP256R1())
    ec_pem = ec.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(KeyFileError, match="not an Ed25519"):
        load_private_key(ec_pem)


def test_encrypted_private_key(tmp_path: Path) -> None:
    private_path, public_path = generate_keypair("carol", tmp_path, passphrase=b"s3cret!")
    assert b"ENCRYPTED" in private_path.read_bytes()
    with pytest.raises(KeyFileError, match="passphrase"):
        load_private_key(private_path)
    with pytest.raises(KeyFileError):
        load_private_key(private_path, passphrase=b"wrong")
    key = load_private_key(private_path, passphrase=b"s3cret!")
    assert key.public_key() == load_public_key(public_path)


def test_default_key_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SAFEACCESS_HOME", str(tmp_path))
    assert default_key_dir() == tmp_path / "keys"
    monkeypatch.delenv("SAFEACCESS_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_key_dir() == tmp_path / "home" / ".safeaccess" / "keys"


# --- CLI ----------------------------------------------------------------------------------


def test_cli_keys_new_and_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SAFEACCESS_HOME", str(tmp_path))
    assert main(["keys", "new", "alice"]) == 0
    out = capsys.readouterr().out
    public_path = tmp_path / "keys" / "alice.pub"
    expected_fp = hashlib.sha256(_raw_from_pem(public_path.read_text())).hexdigest()
    assert expected_fp in out and public_path.read_text() in out

    assert main(["keys", "show", "alice"]) == 0
    assert expected_fp in capsys.readouterr().out
    assert main(["keys", "new", "bob"]) == 0
    capsys.readouterr()
    assert main(["keys", "show"]) == 0  # all keys
    shown = capsys.readouterr().out
    assert "name:        alice" in shown and "name:        bob" in shown
    assert main(["keys", "show", "--key", str(tmp_path / "keys" / "alice.key")]) == 0
    assert expected_fp in capsys.readouterr().out


def test_cli_dir_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "new", "ca", "--dir", str(tmp_path / "k")]) == 0
    assert (tmp_path / "k" / "ca.key").exists()
    assert main(["keys", "show", "ca", "--dir", str(tmp_path / "k")]) == 0
    assert "fingerprint:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["keys", "new", "alice"],  # exists
        ["keys", "new", "../x"],
        ["keys", "show", "nobody"],
        ["keys", "show", "--key", "missing.pem"],
        ["keys", "show", "alice", "--key", "missing.pem"],
    ],
)
def test_cli_user_errors_exit_2_without_traceback(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SAFEACCESS_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    generate_keypair("alice", tmp_path / "keys")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("safeaccess: error: ") and "Traceback" not in err


def test_cli_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "show", "--dir", str(tmp_path)]) == 2
    assert "no keys" in capsys.readouterr().err


def test_cli_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        [],
        ["keys"],
        ["keys", "frobnicate"],
        ["keys", "show", "--dir", "a", "--key", "b"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_console_script_entry_point(tmp_path: Path) -> None:
    env = {**os.environ, "SAFEACCESS_HOME": str(tmp_path)}
    code = "from safeaccess.client.cli import main; raise SystemExit(main())"
    ok = subprocess.run(
        [sys.executable, "-c", code, "keys", "new", "dora"], env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    again = subprocess.run(
        [sys.executable, "-c", code, "keys", "new", "dora"], env=env, capture_output=True, text=True
    )
    assert again.returncode == 2 and "Traceback" not in again.stderr


def test_client_modules_stay_light() -> None:
    # The researcher's install must not pull the server stack in at import time.
    code = (
        "import sys, safeaccess.client.cli, safeaccess.client.keys, safeaccess.client.protocol\n"
        "print(sorted(m for m in ('fastapi', 'docker', 'statsmodels', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_load_private_key_expands_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safeaccess.client.keys import generate_keypair, load_private_key

    monkeypatch.setenv("HOME", str(tmp_path))
    private, _ = generate_keypair("ada", tmp_path / ".safeaccess" / "keys")
    assert load_private_key("~/.safeaccess/keys/ada.key") is not None
    assert load_private_key(Path("~") / ".safeaccess" / "keys" / "ada.key") is not None
    assert private.exists()
