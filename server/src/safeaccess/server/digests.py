"""The server's digests: SHA-256 of bytes, and of a value's canonical JSON (RFC 8785)."""

from __future__ import annotations

import hashlib
from typing import Any

from safeaccess.client.protocol import canonical


def sha256_hex(data: bytes) -> str:
    """Lower-case hex SHA-256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def json_hash(value: Any) -> str:
    """SHA-256 of the canonical JSON (RFC 8785) of a value: stable across processes."""
    return sha256_hex(canonical.dumps(value))
