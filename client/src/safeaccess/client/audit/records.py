"""The audit log's records: canonical JSON (RFC 8785) objects, one per logged event.

Every record has the same envelope: `log` and `version` (the format), `index` (its position in
the log, so a record moved elsewhere no longer fits), `time` (UTC, microseconds), `kind`,
`actor`, `sequence` and `step` (null for administrative records) and `data` (what the event
states, by kind; see docs/audit.md). The Merkle leaf is the record's canonical bytes.

Anything derived from confidential data is logged as facts a check used (counts, degrees of
freedom, dominance shares) or as a salted commitment, never as a bare hash: a bare SHA-256 of a
small table can be found by trying every plausible table, a commitment with a 32-byte random salt
cannot, and whoever holds the opening (the researcher's receipt, the centre) can check it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
from typing import Any, Final, Literal

import rfc8785
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from safeaccess.client.protocol import canonical

LOG_FORMAT: Final = "safeaccess-audit"
LOG_VERSION: Final = 1
SALT_SIZE: Final = 32
COMMITMENT_SCHEME: Final = "sha256(salt||jcs(output))"
_ASTRAL: Final = re.compile(rb"[\xf0-\xf4]")  # lead bytes of characters beyond the BMP
# One encoder for every record (`json.dumps` with options builds a new one per call).
_SORTED_COMPACT: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


class RecordError(ValueError):
    """Bytes that are not a well-formed canonical audit record."""


class LogRecord(BaseModel):
    """The envelope of one audit record."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    log: Literal["safeaccess-audit"]
    version: Literal[1]
    index: int = Field(ge=0)
    time: str
    kind: str = Field(min_length=1)
    actor: str
    sequence: str | None
    step: int | None
    data: dict[str, Any]


def encode_record(fields: dict[str, Any]) -> bytes:
    """The canonical bytes of a record (RFC 8785)."""
    return canonical.dumps(fields)


def is_canonical(raw: bytes, parsed: Any, plain_floats: bool) -> bool:
    """Whether `raw` is the RFC 8785 encoding of `parsed`.

    Fast path: the standard library's sorted compact encoding is byte-identical to RFC 8785
    when every number literal is an integer or a plain decimal (no exponent, no trailing ".0",
    where the two number formats differ) and no key holds characters beyond the Basic
    Multilingual Plane (where UTF-16 and code-point order differ). Anything else, and any
    mismatch, is decided by the RFC 8785 encoder itself."""
    # `isascii` (C, one pass) settles most records before the regular expression is needed.
    if plain_floats and (raw.isascii() or _ASTRAL.search(raw) is None):
        quick = _SORTED_COMPACT.encode(parsed).encode("utf-8")
        if quick == raw:
            return True
    try:
        return bool(canonical.dumps(parsed) == raw)
    except rfc8785.CanonicalizationError:
        return False


class _FloatLiterals(threading.local):
    """Whether every float literal of the record being parsed (in this thread) is plain."""

    plain = True


_FLOATS = _FloatLiterals()


def _parse_float(literal: str) -> float:
    if "e" in literal or "E" in literal or literal.endswith(".0"):
        _FLOATS.plain = False
    return float(literal)


# One decoder for every record: `json.loads` with a hook builds a decoder per call, a measurable
# share of verifying a long log. The hook reports through a thread-local flag instead.
_DECODER: Final = json.JSONDecoder(parse_float=_parse_float)


def decode_record(raw: bytes) -> LogRecord:
    """Parse a record and insist it is exactly the canonical encoding of its own fields, so no
    two readers can read different meanings out of the same logged bytes."""
    _FLOATS.plain = True
    try:
        # Canonical records are UTF-8 (RFC 8785): anything else is refused here.
        parsed = _DECODER.decode(raw.decode("utf-8"))
        record = LogRecord.model_validate(parsed)
    except (ValueError, UnicodeDecodeError) as exc:
        message = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise RecordError(f"not an audit record: {message}") from None
    if not is_canonical(raw, parsed, _FLOATS.plain):
        raise RecordError("the record is not in canonical JSON (RFC 8785) form")
    return record


def new_salt() -> bytes:
    return secrets.token_bytes(SALT_SIZE)


def commit(salt: bytes, output: Any) -> str:
    """The commitment (hex) to an output: SHA-256(salt || canonical JSON of the output)."""
    if len(salt) != SALT_SIZE:
        raise ValueError(f"a commitment salt is {SALT_SIZE} bytes")
    return hashlib.sha256(salt + canonical.dumps(output)).hexdigest()


def opens(commitment: str, salt: bytes, output: Any) -> bool:
    """Whether (salt, output) opens `commitment`."""
    return len(salt) == SALT_SIZE and hmac.compare_digest(commit(salt, output), commitment)
