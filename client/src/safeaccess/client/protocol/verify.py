"""The controller's (and CA's, and auditor's) side: check signatures, then verify step by step."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field

from safeaccess.client.protocol._encoding import TraceBytes
from safeaccess.client.protocol.errors import (
    EndorsementError,
    ExpiredError,
    IncompleteSequenceError,
    MalformedError,
    NotYetValidError,
    OutOfOrderError,
    ProtocolError,
    SequenceFailedError,
    SequenceFinishedError,
    SignatureError,
    TamperedTraceError,
    UntrustedCAError,
    WrongServerError,
)
from safeaccess.client.protocol.header import Header, parse_header
from safeaccess.client.protocol.sealed import (
    Endorsement,
    SealedSequence,
    endorsement_message,
)
from safeaccess.client.protocol.words import MAX_INDEX, Revealed, verify_step

CLOCK_SKEW: Final = timedelta(minutes=5)


class VerifierState(BaseModel):
    """Where a verifier stands; persist it to resume verification after a restart.

    `previous_trace` is T_{next_index - 1} (T_0 before the first reveal). JSON: hex trace.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    next_index: int = Field(ge=1, le=MAX_INDEX + 1)
    previous_trace: TraceBytes
    finished: bool = False
    failed: bool = False


def _check_signature(key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    return _signature_holds(key.public_bytes_raw(), signature, message)


@lru_cache(maxsize=1024)
def _signature_holds(key: bytes, signature: bytes, message: bytes) -> bool:
    # Kept by the exact bytes of all three: a verdict is a function of them alone. The server
    # checks a sequence's header signature again at each reveal (it resumes the verifier from
    # its stored state), which was about a tenth of a millisecond of each reveal's CPU.
    try:
        Ed25519PublicKey.from_public_bytes(key).verify(signature, message)
    except InvalidSignature:
        return False
    return True


class SequenceVerifier:
    """Verifies one sealed sequence as it is revealed, step by step, in order.

    The constructor checks the header, the researcher's signature, every endorsement (each must be
    by a CA in `trusted_cas` and verify with its key), the server binding (if `server` is given)
    and the validity period at `at` (default: now; then every reveal also re-checks expiry).
    Pass `state` to resume a verifier persisted with `.state`.
    """

    def __init__(
        self,
        header: bytes,
        signature: bytes,
        public_key: Ed25519PublicKey,
        endorsements: Iterable[Endorsement] = (),
        trusted_cas: Mapping[str, Ed25519PublicKey] | None = None,
        *,
        state: VerifierState | None = None,
        at: datetime | None = None,
        server: str | None = None,
    ) -> None:
        fields = parse_header(header)
        if not isinstance(signature, bytes) or not _check_signature(public_key, signature, header):
            raise SignatureError(
                f"the header signature does not verify with the public key of researcher "
                f"{fields.researcher!r}: the header was altered or signed by another key"
            )
        trusted = dict(trusted_cas or {})
        verified: list[Endorsement] = []
        for endorsement in endorsements:
            ca_key = trusted.get(endorsement.ca)
            if ca_key is None:
                raise UntrustedCAError(
                    f"endorsement by {endorsement.ca!r}, which is not a trusted certification "
                    "authority here"
                )
            message = endorsement_message(header, endorsement.ca, dict(endorsement.claims))
            if not _check_signature(ca_key, endorsement.signature, message):
                raise EndorsementError(
                    f"the endorsement by {endorsement.ca!r} does not verify with that CA's key: "
                    "it was made for another header, its claims were altered, or another key signed it"
                )
            verified.append(endorsement)
        if server is not None and fields.server != server:
            raise WrongServerError(
                f"the sequence is bound to server {fields.server!r}, not {server!r}"
            )
        moment = datetime.now(UTC) if at is None else at
        if moment.tzinfo is None:
            raise ValueError("`at` must be timezone-aware")
        if moment >= fields.expires:
            raise ExpiredError(f"the sequence expired at {fields.expires.isoformat()}")
        if fields.created > moment + CLOCK_SKEW:
            raise NotYetValidError(
                f"the sequence is created at {fields.created.isoformat()}, in the future; "
                "check the researcher's clock"
            )

        self._header_bytes = header
        self._header = fields
        self._endorsements = tuple(verified)
        # Live verifiers (no fixed `at`) also refuse reveals once the sequence has expired.
        self._expires_ts = fields.expires.timestamp() if at is None else None
        if state is None:
            state = VerifierState(next_index=1, previous_trace=fields.t0)
        elif state.next_index == 1 and state.previous_trace != fields.t0:
            raise MalformedError("the saved state does not belong to this header (T_0 differs)")
        self._next = state.next_index
        self._previous = state.previous_trace
        self._finished = state.finished
        self._failed = state.failed

    @classmethod
    def for_sealed(
        cls,
        sealed: SealedSequence,
        public_key: Ed25519PublicKey,
        trusted_cas: Mapping[str, Ed25519PublicKey] | None = None,
        *,
        at: datetime | None = None,
        server: str | None = None,
    ) -> SequenceVerifier:
        """A fresh verifier for the header, signature and endorsements of a sealed sequence."""
        return cls(
            sealed.header,
            sealed.signature,
            public_key,
            sealed.endorsements,
            trusted_cas,
            at=at,
            server=server,
        )

    @property
    def header(self) -> Header:
        """The verified header fields."""
        return self._header

    @property
    def header_bytes(self) -> bytes:
        """The signed header bytes."""
        return self._header_bytes

    @property
    def endorsements(self) -> tuple[Endorsement, ...]:
        """Endorsements that verified against trusted CAs."""
        return self._endorsements

    @property
    def endorsed_by(self) -> frozenset[str]:
        """Names of the trusted CAs that endorsed this sequence."""
        return frozenset(e.ca for e in self._endorsements)

    @property
    def state(self) -> VerifierState:
        """The current state, to persist (and pass back as `state=` to resume)."""
        return VerifierState(
            next_index=self._next,
            previous_trace=self._previous,
            finished=self._finished,
            failed=self._failed,
        )

    @property
    def next_index(self) -> int:
        """The step the verifier expects next."""
        return self._next

    @property
    def finished(self) -> bool:
        """True once the last step has been verified."""
        return self._finished

    @property
    def failed(self) -> bool:
        """True once a reveal failed verification; the sequence is then aborted for good."""
        return self._failed

    def reveal(self, j: int, trace: bytes, body: bytes) -> Revealed:
        """Verify the reveal of step `j` (trace T_j, body i_j) and advance.

        Ordering errors (wrong step, after the end, after a failure, expiry) change nothing; an
        integrity failure (tampered trace, wrong body, bad word) aborts the sequence for good.
        """
        if self._failed:
            raise SequenceFailedError(
                "the sequence was aborted by an earlier verification failure; nothing more "
                "can be revealed"
            )
        if self._finished:
            raise SequenceFinishedError(
                f"the sequence finished at step {self._next - 1}; nothing more can be revealed"
            )
        if j != self._next:
            raise OutOfOrderError(f"step {j} revealed, but step {self._next} is next")
        if self._expires_ts is not None and time.time() >= self._expires_ts:
            raise ExpiredError(f"the sequence expired at {self._header.expires.isoformat()}")
        try:
            revealed = verify_step(self._previous, j, trace, body)
        except ProtocolError:
            self._failed = True
            raise
        self._previous = trace
        self._next = j + 1
        self._finished = revealed.last
        return revealed


def verify_whole(
    sealed: SealedSequence,
    public_key: Ed25519PublicKey,
    trusted_cas: Mapping[str, Ed25519PublicKey] | None = None,
    *,
    at: datetime | None = None,
    server: str | None = None,
) -> tuple[Revealed, ...]:
    """Check a complete sealed sequence, as a CA or an auditor does, through `SequenceVerifier`.

    Verifies signatures and validity at `at` (default now; an auditor passes the time the
    sequence was opened), then reveals every step in order; the last body must be the last step.
    """
    verifier = SequenceVerifier.for_sealed(sealed, public_key, trusted_cas, at=at, server=server)
    if len(sealed.traces) != len(sealed.bodies) + 1:
        raise MalformedError(
            f"a sequence of {len(sealed.bodies)} bodies needs {len(sealed.bodies) + 1} traces "
            f"(T_0..T_n), got {len(sealed.traces)}"
        )
    if sealed.traces[0] != verifier.header.t0:
        raise TamperedTraceError("T_0 in the file does not match T_0 in the signed header")
    revealed = tuple(
        verifier.reveal(j, sealed.traces[j], body) for j, body in enumerate(sealed.bodies, start=1)
    )
    if not verifier.finished:
        raise IncompleteSequenceError(
            f"the sequence ends after step {len(sealed.bodies)}, which is not its last step "
            "(steps were removed)"
        )
    return revealed
