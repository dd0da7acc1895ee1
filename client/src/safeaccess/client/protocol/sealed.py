"""Sealing a sequence, the sealed-sequence file, and certification-authority endorsements."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
)

from safeaccess.client.cards import card, rows
from safeaccess.client.protocol import canonical
from safeaccess.client.protocol._encoding import B64Bytes, TraceBytes
from safeaccess.client.protocol.errors import (
    EndorsementError,
    InvalidSequenceError,
    MalformedError,
)
from safeaccess.client.protocol.header import (
    NONCE_SIZE,
    Header,
    encode_header,
    parse_header,
)
from safeaccess.client.protocol.words import (
    LOCATOR_SIZE,
    MAX_INDEX,
    body_digest,
    encode_word,
    trace_chain,
)

DEFAULT_VALIDITY: Final = timedelta(days=30)
SEALED_FORMAT: Final = "safeaccess-sealed-sequence/1"
ENDORSEMENT_PROTOCOL: Final = "safeaccess-endorsement"
ENDORSEMENT_VERSION: Final = 1


class Endorsement(BaseModel):
    """A certification authority's Ed25519 signature over a header and its claims."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca: str = Field(min_length=1, max_length=256)
    claims: dict[str, JsonValue] = Field(default_factory=dict)
    signature: B64Bytes


def endorsement_message(header: bytes, ca: str, claims: dict[str, Any]) -> bytes:
    """The bytes a CA signs: canonical JSON binding its name, its claims and SHA-512(header)."""
    try:
        return canonical.dumps(
            {
                "protocol": ENDORSEMENT_PROTOCOL,
                "version": ENDORSEMENT_VERSION,
                "ca": ca,
                "claims": claims,
                "header_sha512": hashlib.sha512(header).hexdigest(),
            }
        )
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise MalformedError(f"endorsement claims must be plain JSON values: {exc}") from None


class SealedSequence(BaseModel):
    """A complete sealed sequence: what a researcher keeps and sends to a CA.

    `traces` holds T_0..T_n and `bodies` i_1..i_n; step j is revealed as (T_j, i_j).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["safeaccess-sealed-sequence/1"] = SEALED_FORMAT
    header: B64Bytes
    signature: B64Bytes
    endorsements: tuple[Endorsement, ...] = ()
    traces: tuple[TraceBytes, ...]
    bodies: tuple[B64Bytes, ...]

    @property
    def header_fields(self) -> Header:
        """The parsed header (raises a `ProtocolError` if the header bytes are not valid)."""
        return parse_header(self.header)

    @property
    def steps(self) -> int:
        """Number of analyses n in the sequence."""
        return len(self.bodies)

    def reveal_for(self, j: int) -> tuple[bytes, bytes]:
        """(T_j, i_j): what the researcher sends to reveal step j (1-based)."""
        if not 1 <= j <= len(self.bodies):
            raise InvalidSequenceError(f"step {j} does not exist; the sequence has {self.steps}")
        return self.traces[j], self.bodies[j - 1]

    def with_endorsement(self, endorsement: Endorsement) -> SealedSequence:
        """A copy with one more endorsement appended."""
        return self.model_copy(update={"endorsements": (*self.endorsements, endorsement)})

    def _repr_html_(self) -> str:
        return sealed_html(self)

    def to_json(self) -> str:
        """The sealed-sequence file (JSON; binary fields in base64, traces in hex)."""
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, data: str | bytes) -> SealedSequence:
        """Read a sealed-sequence file; raises `MalformedError` if it is not one."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'file'}: {err['msg']}"
                for err in exc.errors()[:5]
            )
            raise MalformedError(f"not a valid sealed-sequence file: {problems}") from None


def _resolve_expiry(created: datetime, expires: datetime | timedelta | None) -> datetime:
    if expires is None:
        return created + DEFAULT_VALIDITY
    if isinstance(expires, timedelta):
        return created + expires
    if expires.tzinfo is None:
        raise InvalidSequenceError("expires must be timezone-aware (UTC)")
    return expires


def seal(
    bodies: Sequence[bytes],
    signing_key: Ed25519PrivateKey,
    *,
    researcher: str,
    project: str,
    dataset: str,
    server: str,
    expires: datetime | timedelta | None = None,
    locators: Sequence[bytes] | None = None,
    nonce: bytes | None = None,
    created: datetime | None = None,
    kinds: Iterable[str] | None = None,
) -> SealedSequence:
    """Bind the researcher to the analyses `bodies` (opaque bytes, in order) and sign the header.

    Locators and the nonce come from `secrets`; tests and published vectors inject them.
    `expires` is a time, a validity period from `created`, or None for 30 days. `kinds`, if
    given, declares the analysis kinds the sequence uses (stored sorted and distinct in the
    signed header); a server that requires a CA's claims for some kind then decides at open.
    """
    n = len(bodies)
    if n == 0:
        raise InvalidSequenceError("a sequence needs at least one analysis")
    if n > MAX_INDEX:
        raise InvalidSequenceError(f"a sequence has at most {MAX_INDEX} steps")
    if not all(isinstance(b, bytes) for b in bodies):
        raise InvalidSequenceError("instruction bodies must be bytes (e.g. analyses.to_body())")
    if locators is None:
        locators = [secrets.token_bytes(LOCATOR_SIZE) for _ in range(n)]
    elif len(locators) != n:
        raise InvalidSequenceError(f"{len(locators)} locators given for {n} steps")
    if nonce is None:
        nonce = secrets.token_bytes(NONCE_SIZE)
    elif len(nonce) != NONCE_SIZE:
        raise InvalidSequenceError(f"the nonce must be {NONCE_SIZE} bytes")
    if created is None:
        created = datetime.now(UTC).replace(microsecond=0)
    elif created.tzinfo is None or created.microsecond:
        raise InvalidSequenceError("created must be timezone-aware and a whole second")
    expiry = _resolve_expiry(created, expires)
    if expiry <= created:
        raise InvalidSequenceError("the sequence must expire after it is created")

    words = [
        encode_word(j, body_digest(body), locator)
        for j, (body, locator) in enumerate(zip(bodies, locators, strict=True), start=1)
    ]
    traces = trace_chain(words)
    try:
        fields = Header(
            researcher=researcher,
            project=project,
            dataset=dataset,
            server=server,
            nonce=nonce,
            t0=traces[0],
            created=created,
            expires=expiry,
            kinds=None if kinds is None else tuple(sorted(set(kinds))),
        )
    except ValidationError as exc:
        problems = "; ".join(f"{err['loc'][0]}: {err['msg']}" for err in exc.errors())
        raise InvalidSequenceError(f"invalid header field: {problems}") from None
    header = encode_header(fields)
    return SealedSequence(
        header=header,
        signature=signing_key.sign(header),
        traces=tuple(traces),
        bodies=tuple(bodies),
    )


def endorse(
    sealed_or_header: SealedSequence | bytes,
    ca_signing_key: Ed25519PrivateKey,
    *,
    ca: str,
    claims: dict[str, Any] | None = None,
) -> Endorsement:
    """A CA's endorsement of a sequence header with its claims (e.g. what it certified).

    The CA should first check the whole sequence with `verify_whole`; this only signs.
    """
    header = (
        sealed_or_header.header
        if isinstance(sealed_or_header, SealedSequence)
        else sealed_or_header
    )
    parse_header(header)  # never endorse bytes that are not a valid header
    claims = dict(claims or {})
    if not ca:
        raise EndorsementError("the CA name must not be empty")
    signature = ca_signing_key.sign(endorsement_message(header, ca, claims))
    try:
        return Endorsement(ca=ca, claims=claims, signature=signature)
    except ValidationError as exc:
        raise MalformedError(f"invalid endorsement: {exc.errors()[0]['msg']}") from None


def sealed_html(sealed: SealedSequence) -> str:
    """The sealed sequence's notebook card: who, what, when and the header's SHA-256 (drawn here
    with `cards.py`'s helpers so that the protocol imports nothing above it)."""
    fields = sealed.header_fields
    pairs: list[tuple[str, object]] = [
        ("researcher", fields.researcher),
        ("project", fields.project),
        ("dataset", fields.dataset),
        ("server", fields.server),
        ("steps", sealed.steps),
        ("created", fields.created.isoformat()),
        ("expires", fields.expires.isoformat()),
        ("header SHA-256", hashlib.sha256(sealed.header).hexdigest()),
        ("endorsements", ", ".join(e.ca for e in sealed.endorsements) or "none"),
    ]
    return card("sealed", "Sealed sequence", rows(pairs))
