"""Instruction words and trace arithmetic (the hash-based coding of Domingo-Ferrer, PSD 2022, §3).

Word layout, 64 bytes (the output length of H = SHA-512):

    offset  size  field
         0     4  magic  b"SAIW"
         4     1  version (1)
         5     4  index j, unsigned big-endian, 1-based
         9    32  H'(i_j) = SHA-256 of the instruction body
        41    16  locator: 16 random bytes
        57     7  redundancy: first 7 bytes of SHA-256(bytes 0..56)

Traces: T_n = H(I_n) and T_{j-1} = H(T_j) xor I_j, so a verifier holding T_{j-1} recovers
I_j = H(T_j) xor T_{j-1} and knows step j is the last exactly when H(I_j) == T_j.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

from safeaccess.client.protocol.errors import (
    BodyDigestError,
    IndexMismatchError,
    InvalidSequenceError,
    TamperedTraceError,
    UnsupportedProtocolError,
)

WORD_SIZE: Final = 64
TRACE_SIZE: Final = 64
MAGIC: Final = b"SAIW"
WORD_VERSION: Final = 1
LOCATOR_SIZE: Final = 16
DIGEST_SIZE: Final = 32
REDUNDANCY_SIZE: Final = 7
MAX_INDEX: Final = 2**32 - 1

# Field offsets; the layout table in the module docstring and docs/protocol.md is normative.
_VERSION_AT: Final = 4
_INDEX_AT: Final = 5
_DIGEST_AT: Final = 9
_LOCATOR_AT: Final = 41
_REDUNDANCY_AT: Final = 57

_sha512 = hashlib.sha512
_sha256 = hashlib.sha256
_from_bytes = int.from_bytes


@dataclass(frozen=True, slots=True)
class Word:
    """The decoded fields of a valid instruction word."""

    index: int
    body_digest: bytes
    locator: bytes


@dataclass(frozen=True, slots=True)
class Revealed:
    """A verified step: its index, its body and whether it is the last step of the sequence."""

    index: int
    body: bytes
    last: bool


def body_digest(body: bytes) -> bytes:
    """H'(body): the SHA-256 digest bound into the instruction word."""
    return _sha256(body).digest()


def encode_word(index: int, digest: bytes, locator: bytes) -> bytes:
    """Build the 64-byte instruction word for step `index` (1-based)."""
    if not 1 <= index <= MAX_INDEX:
        raise InvalidSequenceError(f"step index must be between 1 and {MAX_INDEX}, got {index}")
    if len(digest) != DIGEST_SIZE:
        raise InvalidSequenceError(f"body digest must be {DIGEST_SIZE} bytes, got {len(digest)}")
    if len(locator) != LOCATOR_SIZE:
        raise InvalidSequenceError(f"locator must be {LOCATOR_SIZE} bytes, got {len(locator)}")
    head = MAGIC + bytes([WORD_VERSION]) + index.to_bytes(4, "big") + digest + locator
    return head + _sha256(head).digest()[:REDUNDANCY_SIZE]


def xor64(a: bytes, b: bytes) -> bytes:
    """Bytewise xor of two 64-byte strings (through Python ints: measured fastest in CPython)."""
    return (_from_bytes(a, "big") ^ _from_bytes(b, "big")).to_bytes(64, "big")


def trace_chain(words: list[bytes]) -> list[bytes]:
    """Traces T_0..T_n for words I_1..I_n: T_n = H(I_n), T_{j-1} = H(T_j) xor I_j."""
    if not words:
        raise InvalidSequenceError("a sequence needs at least one step")
    traces = [b""] * (len(words) + 1)
    trace = _sha512(words[-1]).digest()
    traces[-1] = trace
    for j in range(len(words), 0, -1):
        trace = xor64(_sha512(trace).digest(), words[j - 1])
        traces[j - 1] = trace
    return traces


def decode_word(word: bytes, *, step: int | None = None) -> Word:
    """Check magic, version and redundancy of a recovered word and return its fields.

    `step` only enriches error messages. Raises `TamperedTraceError` for a word that is not
    well-formed (what a wrong trace yields) and `UnsupportedProtocolError` for a foreign version.
    """
    where = f"step {step}: " if step is not None else ""
    if len(word) != WORD_SIZE:
        raise TamperedTraceError(f"{where}instruction word must be {WORD_SIZE} bytes")
    if word[:_VERSION_AT] != MAGIC:
        raise TamperedTraceError(
            f"{where}the trace does not decode to an instruction word (bad magic): it was altered, "
            "taken from another sequence, or revealed at the wrong position"
        )
    if word[_VERSION_AT] != WORD_VERSION:
        raise UnsupportedProtocolError(
            f"{where}instruction word version {word[_VERSION_AT]} is not supported "
            f"(this verifier knows version {WORD_VERSION})"
        )
    if word[_REDUNDANCY_AT:] != _sha256(word[:_REDUNDANCY_AT]).digest()[:REDUNDANCY_SIZE]:
        raise TamperedTraceError(
            f"{where}the trace does not decode to an instruction word (redundancy check failed): "
            "it was altered, taken from another sequence, or revealed at the wrong position"
        )
    return Word(
        index=_from_bytes(word[_INDEX_AT:_DIGEST_AT], "big"),
        body_digest=word[_DIGEST_AT:_LOCATOR_AT],
        locator=word[_LOCATOR_AT:_REDUNDANCY_AT],
    )


def verify_step(previous_trace: bytes, j: int, trace: bytes, body: bytes) -> Revealed:
    """Verify step `j` given T_{j-1}, the revealed trace T_j and the body i_j.

    Pure function (no state): recovers I_j = H(T_j) xor T_{j-1}, checks the word, its index and
    H'(body), and detects the last step by H(I_j) == T_j. Raises a `ProtocolError` subclass.
    """
    if type(trace) is not bytes or len(trace) != TRACE_SIZE:
        raise TamperedTraceError(f"step {j}: a trace must be {TRACE_SIZE} bytes")
    if type(previous_trace) is not bytes or len(previous_trace) != TRACE_SIZE:
        raise TamperedTraceError(f"step {j}: the previous trace must be {TRACE_SIZE} bytes")
    if not isinstance(body, bytes):
        raise BodyDigestError(f"step {j}: the instruction body must be bytes")
    # Inlined xor and checks: this is the per-step hot path (see benchmarks/protocol.py).
    word = (
        _from_bytes(_sha512(trace).digest(), "big") ^ _from_bytes(previous_trace, "big")
    ).to_bytes(64, "big")
    if (
        word[:_VERSION_AT] != MAGIC
        or word[_VERSION_AT] != WORD_VERSION
        or word[_REDUNDANCY_AT:] != _sha256(word[:_REDUNDANCY_AT]).digest()[:REDUNDANCY_SIZE]
    ):
        decode_word(word, step=j)  # raises the precise error
        raise TamperedTraceError(f"step {j}: invalid instruction word")  # pragma: no cover
    index = _from_bytes(word[_INDEX_AT:_DIGEST_AT], "big")
    if index != j:
        raise IndexMismatchError(
            f"step {j}: the instruction word is for step {index}; steps were reordered, "
            "inserted or deleted"
        )
    if _sha256(body).digest() != word[_DIGEST_AT:_LOCATOR_AT]:
        raise BodyDigestError(
            f"step {j}: the body does not match the digest bound in the sequence "
            "(a different analysis than the one committed to)"
        )
    return Revealed(j, body, _sha512(word).digest() == trace)


def verify_logged_step(previous_trace: bytes, j: int, trace: bytes, digest: bytes) -> bool:
    """Verify step `j` from T_{j-1}, T_j and the body's digest H'(i_j) alone — what an auditor
    holds, since the audit log keeps body digests rather than the analyses. The same checks as
    `verify_step`: the recovered word must decode, carry index `j` and the digest. Returns
    whether this is the last step (H(I_j) == T_j)."""
    if len(trace) != TRACE_SIZE or len(previous_trace) != TRACE_SIZE:
        raise TamperedTraceError(f"step {j}: a trace must be {TRACE_SIZE} bytes")
    word_bytes = xor64(_sha512(trace).digest(), previous_trace)
    word = decode_word(word_bytes, step=j)
    if word.index != j:
        raise IndexMismatchError(
            f"step {j}: the instruction word is for step {word.index}; steps were reordered, "
            "inserted or deleted"
        )
    if word.body_digest != digest:
        raise BodyDigestError(
            f"step {j}: the body digest does not match the one bound in the sequence "
            "(a different analysis than the one committed to)"
        )
    return _sha512(word_bytes).digest() == trace
