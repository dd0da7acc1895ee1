"""Ed25519 keys for researchers and certification authorities: create, load, show.

Private keys are PKCS#8 PEM files created with mode 0600 (never widened then narrowed), public
keys SubjectPublicKeyInfo PEM. A key named NAME lives in NAME.key / NAME.pub in the key directory
($SAFEACCESS_HOME/keys, else ~/.safeaccess/keys).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from safeaccess.client.localstore import safeaccess_home

PRIVATE_SUFFIX: Final = ".key"
PUBLIC_SUFFIX: Final = ".pub"
_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class KeyFileError(ValueError):
    """A key that cannot be read, written or used (missing file, wrong type, bad name...)."""


class KeyExistsError(KeyFileError):
    """Refusal to overwrite an existing key file."""


def default_key_dir() -> Path:
    """$SAFEACCESS_HOME/keys if SAFEACCESS_HOME is set, else ~/.safeaccess/keys."""
    return safeaccess_home() / "keys"


def check_key_name(name: str) -> str:
    """Return `name` if it is a safe key name (no path separators), else raise `KeyFileError`."""
    if not _NAME_RE.match(name) or name.endswith((PRIVATE_SUFFIX, PUBLIC_SUFFIX)):
        raise KeyFileError(
            f"invalid key name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit, without a .key/.pub suffix"
        )
    return name


def key_paths(name: str, directory: Path | None = None) -> tuple[Path, Path]:
    """(private_path, public_path) of key `name` in `directory` (default: `default_key_dir()`)."""
    base = Path(directory) if directory is not None else default_key_dir()
    check_key_name(name)
    return base / f"{name}{PRIVATE_SUFFIX}", base / f"{name}{PUBLIC_SUFFIX}"


def _write_new(path: Path, data: bytes, mode: int) -> None:
    # O_EXCL: never overwrite, even if a file appears between our check and the write;
    # the mode is given at creation so the secret is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def generate_keypair(
    name: str, directory: Path | str | None = None, *, passphrase: bytes | None = None
) -> tuple[Path, Path]:
    """Create a new Ed25519 key pair NAME.key (mode 0600) and NAME.pub; refuse to overwrite.

    With `passphrase`, the private key file is encrypted (best available PKCS#8 encryption).
    """
    private_path, public_path = key_paths(name, Path(directory) if directory else None)
    for path in (private_path, public_path):
        if path.exists() or path.is_symlink():
            raise KeyExistsError(f"{path} already exists; refusing to overwrite a key")
    private_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
    try:
        _write_new(private_path, private_pem, 0o600)
    except FileExistsError:
        raise KeyExistsError(
            f"{private_path} already exists; refusing to overwrite a key"
        ) from None
    try:
        _write_new(public_path, public_key_text(key).encode("ascii"), 0o644)
    except FileExistsError:
        private_path.unlink()  # do not leave half a key pair behind
        raise KeyExistsError(f"{public_path} already exists; refusing to overwrite a key") from None
    return private_path, public_path


def _read(source: Path | str | bytes) -> tuple[bytes, str]:
    if isinstance(source, bytes):
        return source, "the given key bytes"
    path = Path(source).expanduser()  # "~/.safeaccess/keys/ada.key" as written in the guides
    try:
        return path.read_bytes(), str(path)
    except FileNotFoundError:
        raise KeyFileError(f"key file {path} not found") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None


def load_private_key(
    source: Path | str | bytes, *, passphrase: bytes | None = None
) -> Ed25519PrivateKey:
    """Load an Ed25519 private key from a PEM file path or PEM bytes."""
    data, where = _read(source)
    return _private_from_pem(data, where, passphrase)


def _private_from_pem(data: bytes, where: str, passphrase: bytes | None) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=passphrase)
    except TypeError:
        raise KeyFileError(
            f"{where} is encrypted and needs a passphrase"
            if passphrase is None
            else f"{where} is not encrypted; do not give a passphrase"
        ) from None
    except ValueError:
        raise KeyFileError(
            f"{where} is not a PEM private key (or the passphrase is wrong)"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{where} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(source: Path | str | bytes) -> Ed25519PublicKey:
    """Load an Ed25519 public key from a PEM file path or PEM bytes.

    An unencrypted private-key PEM is accepted too (its public half is returned).
    """
    data, where = _read(source)
    if b"PRIVATE KEY" in data:
        return _private_from_pem(data, where, None).public_key()
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise KeyFileError(f"{where} is not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{where} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def public_key_from_raw(raw: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from its 32 raw bytes."""
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise KeyFileError("a raw Ed25519 public key is 32 bytes") from None


def public_key_raw(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    """The 32 raw bytes of a public key (of the public half of a private key)."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(public_key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """SHA-256 of the 32 raw public-key bytes, lowercase hex."""
    return hashlib.sha256(public_key_raw(public_key)).hexdigest()


def public_key_text(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """The public key as SubjectPublicKeyInfo PEM text."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")
