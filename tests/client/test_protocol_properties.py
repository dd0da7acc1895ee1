"""Property tests: honest sequences always verify; every kind of tampering is detected."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safeaccess.client.protocol import (
    BodyDigestError,
    ProtocolError,
    SealedSequence,
    SequenceVerifier,
    SignatureError,
    TamperedTraceError,
    encode_header,
    seal,
    verify_whole,
)

KEY = Ed25519PrivateKey.generate()
PUB = KEY.public_key()
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

bodies_st = st.lists(st.binary(max_size=40), min_size=1, max_size=10)


def make(bodies: list[bytes], **kwargs: Any) -> SealedSequence:
    return seal(
        bodies,
        KEY,
        researcher="r",
        project="p",
        dataset="d",
        server="s",
        **kwargs,
    )


def with_steps(sealed: SealedSequence, traces: list[bytes], bodies: list[bytes]) -> SealedSequence:
    return sealed.model_copy(update={"traces": tuple(traces), "bodies": tuple(bodies)})


def rejected(sealed: SealedSequence) -> bool:
    try:
        verify_whole(sealed, PUB)
    except ProtocolError:
        return True
    return False


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=1, max_value=200), st.randoms(use_true_random=False))
def test_honest_sequences_always_verify(n: int, rnd: random.Random) -> None:
    bodies = [rnd.randbytes(rnd.randrange(0, 64)) for _ in range(n)]
    sealed = make(bodies)
    revealed = verify_whole(sealed, PUB)
    assert [r.body for r in revealed] == bodies
    assert [r.index for r in revealed] == list(range(1, n + 1))
    assert [r.last for r in revealed] == [False] * (n - 1) + [True]


@FAST
@given(bodies_st, st.data())
def test_single_bit_flip_of_any_trace_fails_exactly_there(
    bodies: list[bytes], data: st.DataObject
) -> None:
    sealed = make(bodies)
    k = data.draw(st.integers(1, len(bodies)), label="trace")
    bit = data.draw(st.integers(0, 511), label="bit")
    flipped = bytearray(sealed.traces[k])
    flipped[bit // 8] ^= 1 << (bit % 8)
    verifier = SequenceVerifier.for_sealed(sealed, PUB)
    for j in range(1, k):
        verifier.reveal(j, *sealed.reveal_for(j))
    with pytest.raises(ProtocolError):
        verifier.reveal(k, bytes(flipped), sealed.bodies[k - 1])
    assert verifier.failed


def test_every_bit_of_every_trace_and_of_the_header() -> None:
    sealed = make([b"one", b"two", b"three"])
    for k in range(len(sealed.traces)):
        for bit in range(512):
            traces = list(sealed.traces)
            flipped = bytearray(traces[k])
            flipped[bit // 8] ^= 1 << (bit % 8)
            traces[k] = bytes(flipped)
            assert rejected(with_steps(sealed, traces, list(sealed.bodies))), (k, bit)
    for bit in range(len(sealed.header) * 8):
        header = bytearray(sealed.header)
        header[bit // 8] ^= 1 << (bit % 8)
        assert rejected(sealed.model_copy(update={"header": bytes(header)})), bit


@FAST
@given(bodies_st, st.data())
def test_body_substitution_detected(bodies: list[bytes], data: st.DataObject) -> None:
    sealed = make(bodies)
    k = data.draw(st.integers(1, len(bodies)))
    other = data.draw(st.binary(max_size=40).filter(lambda b: b != bodies[k - 1]))
    changed = list(sealed.bodies)
    changed[k - 1] = other
    with pytest.raises(BodyDigestError):
        verify_whole(with_steps(sealed, list(sealed.traces), changed), PUB)


@FAST
@given(bodies_st, st.data())
def test_insertion_detected(bodies: list[bytes], data: st.DataObject) -> None:
    sealed = make(bodies)
    n = len(bodies)
    at = data.draw(st.integers(1, n + 1), label="position")
    source = data.draw(st.sampled_from(["duplicate", "random", "foreign"]))
    if source == "duplicate":
        j = data.draw(st.integers(1, n))
        trace, body = sealed.reveal_for(j)
    elif source == "random":
        trace, body = data.draw(st.binary(min_size=64, max_size=64)), b"x"
    else:
        foreign = make(bodies)  # same analyses, another sealing
        j = data.draw(st.integers(1, n))
        trace, body = foreign.reveal_for(j)
    traces = [*sealed.traces[:at], trace, *sealed.traces[at:]]
    new_bodies = [*sealed.bodies[: at - 1], body, *sealed.bodies[at - 1 :]]
    assert rejected(with_steps(sealed, traces, new_bodies))


@FAST
@given(bodies_st, st.data())
def test_deletion_detected(bodies: list[bytes], data: st.DataObject) -> None:
    sealed = make(bodies)
    k = data.draw(st.integers(1, len(bodies)))
    traces = [t for i, t in enumerate(sealed.traces) if i != k]
    new_bodies = [b for i, b in enumerate(sealed.bodies, start=1) if i != k]
    assert rejected(with_steps(sealed, traces, new_bodies))


@FAST
@given(st.lists(st.binary(max_size=20), min_size=2, max_size=8), st.data())
def test_reordering_detected(bodies: list[bytes], data: st.DataObject) -> None:
    sealed = make(bodies)
    n = len(bodies)
    order = data.draw(
        st.permutations(range(1, n + 1)).filter(lambda p: list(p) != list(range(1, n + 1)))
    )
    traces = [sealed.traces[0], *(sealed.traces[j] for j in order)]
    new_bodies = [sealed.bodies[j - 1] for j in order]
    assert rejected(with_steps(sealed, traces, new_bodies))


@FAST
@given(bodies_st, st.data())
def test_replay_of_a_step_detected(bodies: list[bytes], data: st.DataObject) -> None:
    sealed = make(bodies)
    n = len(bodies)
    j = data.draw(st.integers(1, n))
    verifier = SequenceVerifier.for_sealed(sealed, PUB)
    for i in range(1, j + 1):
        verifier.reveal(i, *sealed.reveal_for(i))
    # Replaying step j's reveal as step j+1 (or after the end) never passes.
    with pytest.raises(ProtocolError):
        verifier.reveal(j + 1, *sealed.reveal_for(j))


@FAST
@given(
    st.lists(st.binary(max_size=20), min_size=2, max_size=8),
    st.lists(st.binary(max_size=20), min_size=1, max_size=5),
    st.data(),
)
def test_truncation_then_extension_detected(
    bodies: list[bytes], extension: list[bytes], data: st.DataObject
) -> None:
    # The researcher keeps steps 1..k and swaps in a new ending after seeing results; even with
    # the same header fields and the same locators for the kept prefix, the chain breaks at k+1.
    k = data.draw(st.integers(1, len(bodies) - 1))
    locators = [bytes([i]) * 16 for i in range(len(bodies) + len(extension))]
    original = make(bodies, locators=locators[: len(bodies)])
    replacement = make(bodies[:k] + extension, locators=locators[: k + len(extension)])
    if bodies[k:] == extension:
        return  # not an extension: the same sequence again
    traces = [*original.traces[: k + 1], *replacement.traces[k + 1 :]]
    new_bodies = [*original.bodies[:k], *replacement.bodies[k:]]
    assert rejected(with_steps(original, traces, new_bodies))
    verifier = SequenceVerifier.for_sealed(original, PUB)
    for j in range(1, k + 1):
        verifier.reveal(j, *original.reveal_for(j))
    # When the new ending keeps the old sequence's later steps, trace k+1 is the original one
    # (it depends only on the steps after it) and the swapped body is caught by its digest.
    with pytest.raises((TamperedTraceError, BodyDigestError)):
        verifier.reveal(k + 1, *replacement.reveal_for(k + 1))


def test_truncation_keeping_the_tail_is_caught_by_the_body_digest() -> None:
    # The case hypothesis found: [a, b, c] replaced by [a, x, c] with the same locators.
    original = make([b"", b"", b""], locators=[bytes([i]) * 16 for i in range(3)])
    replacement = make([b"", b"\x00", b""], locators=[bytes([i]) * 16 for i in range(3)])
    assert replacement.reveal_for(2)[0] == original.reveal_for(2)[0]
    verifier = SequenceVerifier.for_sealed(original, PUB)
    verifier.reveal(1, *original.reveal_for(1))
    with pytest.raises(BodyDigestError):
        verifier.reveal(2, *replacement.reveal_for(2))


FIELDS = ["researcher", "project", "dataset", "server"]


@FAST
@given(st.sampled_from(FIELDS), st.text(min_size=1, max_size=12).filter(lambda s: s.isprintable()))
def test_swapped_header_field_detected(field: str, value: str) -> None:
    sealed = make([b"a", b"b"])
    fields = sealed.header_fields
    if getattr(fields, field) == value:
        return
    header = encode_header(fields.model_copy(update={field: value}))
    with pytest.raises(SignatureError):
        verify_whole(sealed.model_copy(update={"header": header}), PUB)


def test_headers_swapped_between_sequences_detected() -> None:
    a, b = make([b"a"]), make([b"a"])
    with pytest.raises(SignatureError):
        verify_whole(a.model_copy(update={"header": b.header}), PUB)
    # With b's header and signature, a's traces do not match T_0.
    with pytest.raises(TamperedTraceError):
        verify_whole(a.model_copy(update={"header": b.header, "signature": b.signature}), PUB)


@FAST
@given(bodies_st)
def test_foreign_signature_detected(bodies: list[bytes]) -> None:
    sealed = make(bodies)
    mallory = Ed25519PrivateKey.generate()
    forged = sealed.model_copy(update={"signature": mallory.sign(sealed.header)})
    with pytest.raises(SignatureError):
        verify_whole(forged, PUB)
    # A sequence sealed entirely by another key does not verify as this researcher's.
    own = seal(bodies, mallory, researcher="r", project="p", dataset="d", server="s")
    with pytest.raises(SignatureError):
        verify_whole(own, PUB)


def test_file_edit_of_trace_json_detected() -> None:
    sealed = make([b"x", b"y"])
    obj = json.loads(sealed.to_json())
    obj["traces"][2] = ("0" if obj["traces"][2][0] != "0" else "1") + obj["traces"][2][1:]
    assert rejected(SealedSequence.from_json(json.dumps(obj)))
