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
import secrets
from typing import Any, Final, Literal

import rfc8785
from pydantic import BaseModel, ConfigDict, Field, ValidationError

LOG_FORMAT: Final = "safeaccess-audit"
LOG_VERSION: Final = 1
SALT_SIZE: Final = 32
COMMITMENT_SCHEME: Final = "sha256(salt||jcs(output))"


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
    return rfc8785.dumps(fields)


def decode_record(raw: bytes) -> LogRecord:
    """Parse a record and insist it is exactly the canonical encoding of its own fields, so no
    two readers can read different meanings out of the same logged bytes."""
    try:
        record = LogRecord.model_validate_json(raw)
    except ValidationError as exc:
        raise RecordError(f"not an audit record: {exc.errors()[0]['msg']}") from None
    if encode_record(record.model_dump(mode="json")) != raw:
        raise RecordError("the record is not in canonical JSON (RFC 8785) form")
    return record


def new_salt() -> bytes:
    return secrets.token_bytes(SALT_SIZE)


def commit(salt: bytes, output: Any) -> str:
    """The commitment (hex) to an output: SHA-256(salt || canonical JSON of the output)."""
    if len(salt) != SALT_SIZE:
        raise ValueError(f"a commitment salt is {SALT_SIZE} bytes")
    return hashlib.sha256(salt + rfc8785.dumps(output)).hexdigest()


def opens(commitment: str, salt: bytes, output: Any) -> bool:
    """Whether (salt, output) opens `commitment`."""
    return len(salt) == SALT_SIZE and hmac.compare_digest(commit(salt, output), commitment)
