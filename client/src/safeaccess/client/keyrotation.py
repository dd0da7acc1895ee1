"""Signed changes of a researcher's key, as the audit log records them.

A researcher's key changes only by one of two logged events, never by registering her again:

- `researcher_key_rotated`: she asked for it, and proves it by signing the rotation statement
  (server id, her name, the old key's fingerprint, the new public key) with her *old* key;
- `researcher_key_revoked`: the centre replaced her key without that signature (she lost it, or
  it leaked) and logged why. Her client flags it at her next connection, so a centre that
  swaps her key to sign sequences in her name is seen by her, and by every auditor.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict

from safeaccess.client.protocol import canonical

ROTATION_CONTEXT: Final = "safeaccess-key-rotation-v1"
ROTATED: Final = "researcher_key_rotated"
REVOKED: Final = "researcher_key_revoked"


def rotation_statement(
    server_id: str, researcher: str, old_fingerprint: str, new_public_key: str
) -> bytes:
    """The canonical bytes the old key signs to authorise its replacement by `new_public_key`
    (PEM text) on `server_id` only."""
    return canonical.dumps(
        {
            "context": ROTATION_CONTEXT,
            "server": server_id,
            "researcher": researcher,
            "old_fingerprint": old_fingerprint,
            "new_public_key": new_public_key,
        }
    )


def sign_rotation(
    old_key: Ed25519PrivateKey,
    server_id: str,
    researcher: str,
    old_fingerprint: str,
    new_public_key: str,
) -> str:
    """The old key's signature (base64) over the rotation statement."""
    statement = rotation_statement(server_id, researcher, old_fingerprint, new_public_key)
    return base64.b64encode(old_key.sign(statement)).decode("ascii")


def rotation_signed_by(
    old_key: Ed25519PublicKey,
    signature: str,
    server_id: str,
    researcher: str,
    old_fingerprint: str,
    new_public_key: str,
) -> bool:
    """Whether `signature` is `old_key`'s signature over this rotation."""
    try:
        raw = base64.b64decode(signature, validate=True)
        old_key.verify(
            raw, rotation_statement(server_id, researcher, old_fingerprint, new_public_key)
        )
    except (binascii.Error, ValueError, InvalidSignature):
        return False
    return True


class KeyStatus(BaseModel):
    """What the centre's log says about one key fingerprint (unauthenticated lookup)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: Literal["current", "rotated", "revoked", "removed", "unknown"]
    entry: int | None = None  # the log entry that replaced (or removed) it
    reason: str | None = None  # a revocation's reason, as logged
    replaced_by: str | None = None  # the fingerprint of the key that replaced it
