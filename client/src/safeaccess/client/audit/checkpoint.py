"""Signed checkpoints in the transparency-log note format (C2SP signed-note, tlog-checkpoint).

A checkpoint's text is the origin line (the log's name), the tree size in decimal, the root hash
in base64, and one extension line `time <unix seconds>`, each ending in a newline. A signed note
is that text, a blank line, and one signature line per signer:
`— <key name> <base64(key hash (4 bytes) || Ed25519 signature)>`, where the key hash is the first
four bytes of SHA-256(key name || "\\n" || 0x01 || public key), 0x01 naming Ed25519. The
signature covers the text exactly. Any tool that verifies Go `sumdb/note` notes can check ours.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ED25519_ALG: Final = b"\x01"
EM_DASH: Final = "\u2014"
_NAME = re.compile(r"^[^\s+]+$")
_SIG_LINE = re.compile(r"^\u2014 (?P<name>\S+) (?P<sig>[A-Za-z0-9+/=]+)$")


class CheckpointError(ValueError):
    """A checkpoint is malformed or its signature does not verify."""


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    time: int

    def text(self) -> str:
        """The signed text of the note (ends with a newline)."""
        root = base64.b64encode(self.root).decode("ascii")
        return f"{self.origin}\n{self.size}\n{root}\ntime {self.time}\n"


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_hash(name: str, key: Ed25519PublicKey) -> bytes:
    """The 4-byte key hash of the signed-note format."""
    return hashlib.sha256(name.encode() + b"\n" + ED25519_ALG + _raw(key)).digest()[:4]


def verifier_key(name: str, key: Ed25519PublicKey) -> str:
    """The note verifier key string `<name>+<hash hex>+<base64(0x01 || key)>`."""
    encoded = base64.b64encode(ED25519_ALG + _raw(key)).decode("ascii")
    return f"{name}+{key_hash(name, key).hex()}+{encoded}"


def sign_checkpoint(checkpoint: Checkpoint, name: str, key: Ed25519PrivateKey) -> str:
    """The signed note: text, blank line, the signature line."""
    if not _NAME.match(name):
        raise ValueError(f"key name {name!r} must not contain spaces or '+'")
    text = checkpoint.text()
    blob = key_hash(name, key.public_key()) + key.sign(text.encode())
    return f"{text}\n{EM_DASH} {name} {base64.b64encode(blob).decode('ascii')}\n"


def _parse_text(text: str) -> Checkpoint:
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "":
        raise CheckpointError("a checkpoint has an origin, a size and a root hash, one per line")
    origin, size, root_b64, *extensions = lines[:-1]
    if not origin or not size.isdigit() or (size != "0" and size.startswith("0")):
        raise CheckpointError("the checkpoint's origin or size line is malformed")
    try:
        root = base64.b64decode(root_b64, validate=True)
    except binascii.Error:
        raise CheckpointError("the checkpoint's root hash is not base64") from None
    if len(root) != 32:
        raise CheckpointError("the checkpoint's root hash is not 32 bytes")
    times = [e for e in extensions if e.startswith("time ")]
    if len(times) != 1 or not times[0][5:].isdigit():
        raise CheckpointError("the checkpoint needs exactly one 'time <unix seconds>' line")
    return Checkpoint(origin=origin, size=int(size), root=root, time=int(times[0][5:]))


def parse_checkpoint(note: str) -> tuple[Checkpoint, str, list[tuple[str, bytes]]]:
    """(checkpoint, signed text, [(key name, key hash || signature)]) of a signed note."""
    text, sep, signatures = note.partition("\n\n")
    if not sep:
        raise CheckpointError("a signed note needs a blank line between the text and signatures")
    text += "\n"
    sigs: list[tuple[str, bytes]] = []
    for line in signatures.rstrip("\n").split("\n"):
        match = _SIG_LINE.match(line)
        if not match:
            raise CheckpointError(f"malformed signature line {line[:80]!r}")
        try:
            blob = base64.b64decode(match.group("sig"), validate=True)
        except binascii.Error:
            raise CheckpointError("a signature is not base64") from None
        if len(blob) < 5:
            raise CheckpointError("a signature is too short")
        sigs.append((match.group("name"), blob))
    return _parse_text(text), text, sigs


def verify_checkpoint(note: str, name: str, key: Ed25519PublicKey) -> Checkpoint:
    """The checkpoint of a note that carries a valid signature by (`name`, `key`), or raise."""
    checkpoint, text, sigs = parse_checkpoint(note)
    wanted = key_hash(name, key)
    for sig_name, blob in sigs:
        if sig_name != name or blob[:4] != wanted:
            continue
        try:
            key.verify(blob[4:], text.encode())
        except InvalidSignature:
            raise CheckpointError(
                f"the checkpoint's signature by {name} does not verify: the note was altered"
            ) from None
        return checkpoint
    raise CheckpointError(
        f"the checkpoint is not signed by {name} with the expected key "
        f"({verifier_key(name, key)}): it comes from another key or another log"
    )
