"""The sequence header: canonical JSON (RFC 8785) that the researcher signs with Ed25519.

Fields (all required, no others): protocol, version, researcher, project, dataset, server,
nonce (16 bytes, lowercase hex), t0 (T_0, 64 bytes, lowercase hex), created and expires
(UTC, RFC 3339 to the second with a trailing "Z"). One optional field, kinds: the analysis
kinds the sequence will use (a non-empty, sorted list of distinct names), which lets a server
require a certification authority's claims at open time without seeing the bodies; a header
without it is encoded exactly as before (the key is absent, never null). The byte string is
the signed object; a header is accepted only if it is exactly the canonical encoding of its own fields, so two
parsers can never read different meanings out of the same signed bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from functools import lru_cache
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_serializer,
    field_validator,
    model_serializer,
)

from safeaccess.client.protocol import canonical
from safeaccess.client.protocol.errors import MalformedError, UnsupportedProtocolError

PROTOCOL_ID: Final = "safeaccess-sequence"
PROTOCOL_VERSION: Final = 1
NONCE_SIZE: Final = 16
MAX_HEADER_BYTES: Final = 8192

_TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%SZ"
_TIME_RE: Final = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")

Name = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
KindName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
MAX_KINDS: Final = 64


def format_time(moment: datetime) -> str:
    """RFC 3339 UTC to the second, the only time format a header may contain."""
    if moment.tzinfo is None:
        raise MalformedError("header times must be timezone-aware (UTC)")
    return moment.astimezone(UTC).strftime(_TIME_FORMAT)


def _parse_time(value: object) -> datetime:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("times must be timezone-aware")
        return value.astimezone(UTC)
    if not isinstance(value, str) or not _TIME_RE.match(value):
        raise ValueError("times must look like 2026-01-31T12:00:00Z")
    return datetime.strptime(value, _TIME_FORMAT).replace(tzinfo=UTC)


def _parse_hex(value: object, size: int) -> bytes:
    if isinstance(value, bytes):
        raw = value
    elif isinstance(value, str) and re.fullmatch(r"[0-9a-f]*", value):
        raw = bytes.fromhex(value)
    else:
        raise ValueError("must be lowercase hexadecimal")
    if len(raw) != size:
        raise ValueError(f"must be {size} bytes")
    return raw


class Header(BaseModel):
    """The parsed fields of a sequence header."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    protocol: Literal["safeaccess-sequence"] = PROTOCOL_ID
    version: Literal[1] = PROTOCOL_VERSION
    researcher: Name
    project: Name
    dataset: Name
    server: Name
    nonce: bytes
    t0: bytes
    created: datetime
    expires: datetime
    kinds: tuple[KindName, ...] | None = None

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        # One spelling per set of kinds: sorted and distinct, so the signed bytes say nothing
        # about the order of the steps and two encodings of one declaration cannot differ.
        if value is None:
            return None
        if not value or len(value) > MAX_KINDS:
            raise ValueError(f"declare between 1 and {MAX_KINDS} analysis kinds, or omit the field")
        if list(value) != sorted(set(value)):
            raise ValueError("kinds must be distinct and sorted")
        return value

    @field_validator("nonce", mode="before")
    @classmethod
    def _nonce(cls, value: object) -> bytes:
        return _parse_hex(value, NONCE_SIZE)

    @field_validator("t0", mode="before")
    @classmethod
    def _t0(cls, value: object) -> bytes:
        return _parse_hex(value, 64)

    @field_validator("created", "expires", mode="before")
    @classmethod
    def _time(cls, value: object) -> datetime:
        moment = _parse_time(value)
        if moment.microsecond:
            raise ValueError("times are whole seconds")
        return moment

    @model_serializer(mode="wrap")
    def _omit_undeclared(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # An undeclared `kinds` is absent, never null: headers without it keep their bytes.
        data: dict[str, Any] = handler(self)
        if data.get("kinds") is None:
            data.pop("kinds", None)
        return data

    @field_serializer("nonce", "t0", when_used="json")
    def _hex_out(self, value: bytes) -> str:
        return value.hex()

    @field_serializer("created", "expires", when_used="json")
    def _time_out(self, value: datetime) -> str:
        return format_time(value)

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON object whose canonical encoding is the header bytes (no `kinds` key when
        nothing is declared, so such headers keep their original encoding)."""
        return self.model_dump(mode="json")


def encode_header(header: Header) -> bytes:
    """The canonical (RFC 8785) bytes of a header: what the researcher signs."""
    if header.expires <= header.created:
        raise MalformedError("a header must expire after it is created")
    return canonical.dumps(header.to_json_dict())


def parse_header(data: bytes) -> Header:
    """Parse and strictly check signed header bytes.

    Raises `UnsupportedProtocolError` for a foreign protocol id or version and `MalformedError`
    for anything else that is not exactly a canonical header.
    """
    if not isinstance(data, bytes):
        raise MalformedError("a header must be bytes")
    return _parsed(data)


@lru_cache(maxsize=1024)
def _parsed(data: bytes) -> Header:
    # Kept by the header's exact bytes (a refusal raises, and is not kept): the result is a
    # function of them, and a `Header` is immutable. The server parses a sequence's stored
    # header again at each reveal, about a tenth of a millisecond each time.
    if len(data) > MAX_HEADER_BYTES:
        raise MalformedError(f"a header is at most {MAX_HEADER_BYTES} bytes")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedError(f"the header is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise MalformedError("the header must be a JSON object")
    if obj.get("protocol") != PROTOCOL_ID:
        raise UnsupportedProtocolError(
            f"unknown protocol {obj.get('protocol')!r}; expected {PROTOCOL_ID!r}"
        )
    if obj.get("version") != PROTOCOL_VERSION or type(obj.get("version")) is not int:
        raise UnsupportedProtocolError(
            f"unsupported {PROTOCOL_ID} version {obj.get('version')!r}; "
            f"this verifier knows version {PROTOCOL_VERSION}"
        )
    try:
        header = Header.model_validate(obj)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'header'}: {err['msg']}"
            for err in exc.errors()
        )
        raise MalformedError(f"invalid header: {problems}") from None
    if encode_header(header) != data:
        raise MalformedError(
            "the header is not in canonical form (RFC 8785: sorted keys, no whitespace, "
            "no duplicate keys)"
        )
    return header


def header_digest(data: bytes) -> str:
    """SHA-256 of the header bytes, hex: a stable identifier of a sequence (for 'usable once')."""
    return hashlib.sha256(data).hexdigest()
