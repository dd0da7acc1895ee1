"""The binding-sequence protocol (Domingo-Ferrer, PSD 2022, §3): seal, endorse, verify.

A researcher seals analyses i_1..i_n into instruction words and a hash chain of traces
T_0..T_n, signs a header carrying T_0, and later reveals (T_j, i_j) one step at a time. The
verifier recovers each word from two consecutive traces and checks it. See docs/protocol.md.
"""

from safeaccess.client.protocol.errors import (
    BodyDigestError,
    EndorsementError,
    ExpiredError,
    IncompleteSequenceError,
    IndexMismatchError,
    InvalidSequenceError,
    MalformedError,
    NotYetValidError,
    OutOfOrderError,
    ProtocolError,
    SequenceFailedError,
    SequenceFinishedError,
    SignatureError,
    TamperedTraceError,
    UnsupportedProtocolError,
    UntrustedCAError,
    ValidityError,
    WrongServerError,
)
from safeaccess.client.protocol.header import (
    PROTOCOL_ID,
    PROTOCOL_VERSION,
    Header,
    encode_header,
    header_digest,
    parse_header,
)
from safeaccess.client.protocol.sealed import (
    DEFAULT_VALIDITY,
    Endorsement,
    SealedSequence,
    endorse,
    endorsement_message,
    seal,
)
from safeaccess.client.protocol.verify import (
    CLOCK_SKEW,
    SequenceVerifier,
    VerifierState,
    verify_whole,
)
from safeaccess.client.protocol.words import (
    Revealed,
    Word,
    body_digest,
    decode_word,
    encode_word,
    trace_chain,
    verify_step,
)

__all__ = [
    "CLOCK_SKEW",
    "DEFAULT_VALIDITY",
    "PROTOCOL_ID",
    "PROTOCOL_VERSION",
    "BodyDigestError",
    "Endorsement",
    "EndorsementError",
    "ExpiredError",
    "Header",
    "IncompleteSequenceError",
    "IndexMismatchError",
    "InvalidSequenceError",
    "MalformedError",
    "NotYetValidError",
    "OutOfOrderError",
    "ProtocolError",
    "Revealed",
    "SealedSequence",
    "SequenceFailedError",
    "SequenceFinishedError",
    "SequenceVerifier",
    "SignatureError",
    "TamperedTraceError",
    "UnsupportedProtocolError",
    "UntrustedCAError",
    "ValidityError",
    "VerifierState",
    "Word",
    "WrongServerError",
    "body_digest",
    "decode_word",
    "encode_header",
    "encode_word",
    "endorse",
    "endorsement_message",
    "header_digest",
    "parse_header",
    "seal",
    "trace_chain",
    "verify_step",
    "verify_whole",
]
