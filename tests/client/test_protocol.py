"""Unit tests of the binding-sequence protocol: header, words, seal, verifier, endorsements."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.protocol import (
    BodyDigestError,
    EndorsementError,
    ExpiredError,
    IncompleteSequenceError,
    InvalidSequenceError,
    MalformedError,
    NotYetValidError,
    OutOfOrderError,
    ProtocolError,
    SealedSequence,
    SequenceFailedError,
    SequenceFinishedError,
    SequenceVerifier,
    SignatureError,
    TamperedTraceError,
    UnsupportedProtocolError,
    UntrustedCAError,
    VerifierState,
    WrongServerError,
    decode_word,
    encode_header,
    encode_word,
    endorse,
    header_digest,
    parse_header,
    seal,
    verify_step,
    verify_whole,
)
from safeaccess.client.protocol import verify as verify_module

KEY = Ed25519PrivateKey.generate()
PUB = KEY.public_key()
CA_KEY = Ed25519PrivateKey.generate()
BODIES = [b'{"kind":"summary","variables":["age"]}', b"second", b"third"]


def make(bodies: list[bytes] = BODIES, **kwargs: Any) -> SealedSequence:
    args: dict[str, Any] = {
        "researcher": "alice",
        "project": "P1",
        "dataset": "census",
        "server": "sac-1",
    }
    args.update(kwargs)
    return seal(bodies, KEY, **args)


# --- header -------------------------------------------------------------------------------


def test_header_fields_round_trip() -> None:
    created = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    sealed = make(created=created, expires=timedelta(days=2), nonce=bytes(range(16)))
    h = sealed.header_fields
    assert (h.researcher, h.project, h.dataset, h.server) == ("alice", "P1", "census", "sac-1")
    assert h.nonce == bytes(range(16))
    assert h.t0 == sealed.traces[0]
    assert h.created == created and h.expires == created + timedelta(days=2)
    assert (h.protocol, h.version) == ("safeaccess-sequence", 1)
    assert encode_header(h) == sealed.header
    assert h.model_dump(mode="json") == json.loads(sealed.header)
    assert type(h).model_validate_json(h.model_dump_json()) == h
    assert header_digest(sealed.header) == hashlib.sha256(sealed.header).hexdigest()


def test_default_expiry_is_thirty_days() -> None:
    h = make().header_fields
    assert h.expires - h.created == timedelta(days=30)


def _mutated_header(sealed: SealedSequence, **changes: object) -> bytes:
    obj = json.loads(sealed.header)
    obj.update(changes)
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def test_parse_header_rejects_non_canonical_bytes() -> None:
    sealed = make()
    with pytest.raises(MalformedError, match="canonical"):
        parse_header(sealed.header.replace(b",", b", ", 1))
    # A duplicated key: a lenient parser would read one value, another parser the other.
    duplicate = sealed.header[:-1] + b',"researcher":"mallory"}'
    with pytest.raises(MalformedError):
        parse_header(duplicate)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"protocol": "other"}, UnsupportedProtocolError),
        ({"version": 2}, UnsupportedProtocolError),
        ({"version": True}, UnsupportedProtocolError),
        ({"extra": 1}, MalformedError),
        ({"t0": "ab" * 63}, MalformedError),
        ({"nonce": "AB" * 16}, MalformedError),
        ({"created": "2026-01-01T00:00:00+00:00"}, MalformedError),
        ({"researcher": ""}, MalformedError),
        ({"researcher": "a\nb"}, MalformedError),
        ({"expires": "2000-01-01T00:00:00Z"}, MalformedError),
    ],
)
def test_parse_header_rejects_bad_fields(changes: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        parse_header(_mutated_header(make(), **changes))


def test_parse_header_rejects_non_json() -> None:
    for bad in (b"\xff\xfe", b"[1,2]", b"not json"):
        with pytest.raises(MalformedError):
            parse_header(bad)


# --- words --------------------------------------------------------------------------------


def test_word_layout_by_hand() -> None:
    digest, locator = bytes(range(32)), bytes(range(100, 116))
    word = encode_word(7, digest, locator)
    assert len(word) == 64
    assert word[:4] == b"SAIW" and word[4] == 1
    assert word[5:9] == b"\x00\x00\x00\x07"
    assert word[9:41] == digest and word[41:57] == locator
    assert word[57:] == hashlib.sha256(word[:57]).digest()[:7]
    fields = decode_word(word)
    assert (fields.index, fields.body_digest, fields.locator) == (7, digest, locator)


def test_unknown_word_version_is_reported_as_such() -> None:
    head = b"SAIW" + b"\x02" + (1).to_bytes(4, "big") + bytes(48)
    word = head + hashlib.sha256(head).digest()[:7]
    with pytest.raises(UnsupportedProtocolError, match="version 2"):
        decode_word(word)


@pytest.mark.parametrize(
    ("index", "digest", "locator"),
    [
        (0, bytes(32), bytes(16)),
        (2**32, bytes(32), bytes(16)),
        (1, bytes(31), bytes(16)),
        (1, bytes(32), bytes(15)),
    ],
)
def test_encode_word_rejects_bad_fields(index: int, digest: bytes, locator: bytes) -> None:
    with pytest.raises(InvalidSequenceError):
        encode_word(index, digest, locator)


def test_verify_step_is_pure_and_detects_last() -> None:
    sealed = make()
    first = verify_step(sealed.traces[0], 1, sealed.traces[1], BODIES[0])
    again = verify_step(sealed.traces[0], 1, sealed.traces[1], BODIES[0])
    assert first == again and not first.last and first.index == 1
    last = verify_step(sealed.traces[2], 3, sealed.traces[3], BODIES[2])
    assert last.last and last.body == BODIES[2]
    with pytest.raises(TamperedTraceError):
        verify_step(sealed.traces[0], 1, sealed.traces[1][:63], BODIES[0])


# --- seal ---------------------------------------------------------------------------------


def test_seal_uses_fresh_randomness() -> None:
    a, b = make(), make()
    assert a.traces[0] != b.traces[0]
    assert a.header_fields.nonce != b.header_fields.nonce


def test_seal_is_deterministic_given_injected_randomness() -> None:
    fixed: dict[str, Any] = {
        "locators": [bytes([i]) * 16 for i in range(3)],
        "nonce": bytes(16),
        "created": datetime(2026, 1, 1, tzinfo=UTC),
    }
    assert make(**fixed) == make(**fixed)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bodies": []},
        {"bodies": ["text"]},
        {"locators": [bytes(16)]},
        {"locators": [bytes(15)] * 3},
        {"nonce": bytes(8)},
        {"created": datetime(2026, 1, 1)},
        {"created": datetime(2026, 1, 1, 0, 0, 0, 5, tzinfo=UTC)},
        {"expires": timedelta(seconds=-1)},
        {"expires": datetime(2026, 1, 1)},
        {"researcher": ""},
    ],
)
def test_seal_rejects_bad_input(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidSequenceError):
        make(**kwargs)


def test_sealed_json_round_trip_and_errors() -> None:
    sealed = endorse_into(make())
    text = sealed.to_json()
    assert SealedSequence.from_json(text) == sealed
    obj = json.loads(text)
    obj["traces"][1] = obj["traces"][1][:-2]
    with pytest.raises(MalformedError, match="trace"):
        SealedSequence.from_json(json.dumps(obj))
    for bad in ("{}", "[]", "nope", '{"header": "***"}'):
        with pytest.raises(MalformedError):
            SealedSequence.from_json(bad)


def test_reveal_for() -> None:
    sealed = make()
    assert sealed.reveal_for(2) == (sealed.traces[2], BODIES[1])
    with pytest.raises(InvalidSequenceError):
        sealed.reveal_for(4)


# --- verifier -----------------------------------------------------------------------------


def test_honest_sequence_step_by_step() -> None:
    sealed = make()
    verifier = SequenceVerifier(sealed.header, sealed.signature, PUB, server="sac-1")
    assert verifier.state == VerifierState(next_index=1, previous_trace=sealed.traces[0])
    results = [verifier.reveal(j, *sealed.reveal_for(j)) for j in (1, 2, 3)]
    assert [r.body for r in results] == BODIES
    assert [r.last for r in results] == [False, False, True]
    assert verifier.finished and not verifier.failed
    with pytest.raises(SequenceFinishedError):
        verifier.reveal(4, sealed.traces[3], b"more")


def test_out_of_order_changes_nothing() -> None:
    sealed = make()
    verifier = SequenceVerifier.for_sealed(sealed, PUB)
    before = verifier.state
    with pytest.raises(OutOfOrderError):
        verifier.reveal(2, *sealed.reveal_for(2))
    assert verifier.state == before
    verifier.reveal(1, *sealed.reveal_for(1))
    with pytest.raises(OutOfOrderError):  # replay of step 1
        verifier.reveal(1, *sealed.reveal_for(1))
    assert verifier.reveal(2, *sealed.reveal_for(2)).index == 2


def test_failure_aborts_for_good() -> None:
    sealed = make()
    verifier = SequenceVerifier.for_sealed(sealed, PUB)
    with pytest.raises(BodyDigestError):
        verifier.reveal(1, sealed.traces[1], b"another analysis")
    assert verifier.failed and verifier.state.failed
    with pytest.raises(SequenceFailedError):
        verifier.reveal(1, *sealed.reveal_for(1))


def test_resume_from_persisted_state() -> None:
    sealed = make()
    first = SequenceVerifier.for_sealed(sealed, PUB)
    first.reveal(1, *sealed.reveal_for(1))
    saved = first.state.model_dump_json()
    state = VerifierState.model_validate_json(saved)
    assert state == first.state and state.next_index == 2
    resumed = SequenceVerifier(sealed.header, sealed.signature, PUB, state=state)
    assert not resumed.reveal(2, *sealed.reveal_for(2)).last
    assert resumed.reveal(3, *sealed.reveal_for(3)).last
    for flags in ({"finished": True}, {"failed": True}):
        stuck = SequenceVerifier(
            sealed.header, sealed.signature, PUB, state=state.model_copy(update=flags)
        )
        with pytest.raises((SequenceFinishedError, SequenceFailedError)):
            stuck.reveal(2, *sealed.reveal_for(2))


def test_state_for_another_header_is_refused() -> None:
    a, b = make(), make()
    with pytest.raises(MalformedError):
        SequenceVerifier(
            a.header,
            a.signature,
            PUB,
            state=VerifierState(next_index=1, previous_trace=b.traces[0]),
        )


def test_wrong_server() -> None:
    sealed = make()
    with pytest.raises(WrongServerError, match="sac-1"):
        SequenceVerifier.for_sealed(sealed, PUB, server="sac-2")


def test_validity_period() -> None:
    created = datetime(2026, 1, 1, tzinfo=UTC)
    sealed = make(created=created, expires=timedelta(hours=1))
    SequenceVerifier.for_sealed(sealed, PUB, at=created + timedelta(minutes=59))
    with pytest.raises(ExpiredError):
        SequenceVerifier.for_sealed(sealed, PUB, at=created + timedelta(hours=1))
    with pytest.raises(NotYetValidError):
        SequenceVerifier.for_sealed(sealed, PUB, at=created - timedelta(minutes=6))
    SequenceVerifier.for_sealed(sealed, PUB, at=created - timedelta(minutes=4))  # clock skew
    with pytest.raises(ExpiredError):  # live verifier (time = now): a 1-second sequence of the past
        SequenceVerifier.for_sealed(make(created=created, expires=timedelta(seconds=1)), PUB)


def test_live_verifier_refuses_reveals_after_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    sealed = make(expires=timedelta(hours=1))
    verifier = SequenceVerifier.for_sealed(sealed, PUB)
    verifier.reveal(1, *sealed.reveal_for(1))
    later = sealed.header_fields.expires.timestamp() + 1
    monkeypatch.setattr(verify_module.time, "time", lambda: later)
    before = verifier.state
    with pytest.raises(ExpiredError):
        verifier.reveal(2, *sealed.reveal_for(2))
    assert verifier.state == before


def test_signature_checks() -> None:
    sealed = make()
    other = Ed25519PrivateKey.generate()
    with pytest.raises(SignatureError):
        SequenceVerifier(sealed.header, sealed.signature, other.public_key())
    with pytest.raises(SignatureError):
        SequenceVerifier(sealed.header, other.sign(sealed.header), PUB)
    with pytest.raises(SignatureError):
        SequenceVerifier(sealed.header, b"", PUB)


def test_a_header_verified_once_is_verified_again_from_its_exact_bytes_only() -> None:
    # The server resumes a verifier at every reveal, so the header's parse and signature
    # verdict are kept; whatever differs in a byte (header, signature, key) is checked afresh.
    sealed = make()
    first = SequenceVerifier(sealed.header, sealed.signature, PUB)
    hits = verify_module._signature_holds.cache_info().hits
    again = SequenceVerifier(sealed.header, sealed.signature, PUB)
    assert verify_module._signature_holds.cache_info().hits == hits + 1
    assert again.header == first.header and parse_header(sealed.header) is first.header
    other = Ed25519PrivateKey.generate()
    with pytest.raises(SignatureError):
        SequenceVerifier(sealed.header, sealed.signature, other.public_key())
    flipped = bytes([sealed.signature[0] ^ 1]) + sealed.signature[1:]
    with pytest.raises(SignatureError):
        SequenceVerifier(sealed.header, flipped, PUB)
    # Another header (its nonce), signed by the same key, is not the verified one.
    forged = sealed.header.replace(sealed.header_fields.nonce.hex().encode(), b"00" * 16)
    assert forged != sealed.header
    with pytest.raises(SignatureError):
        SequenceVerifier(forged, sealed.signature, PUB)
    # A refusal is not kept: the malformed header is refused again, each time.
    for _ in range(2):
        with pytest.raises(MalformedError):
            parse_header(sealed.header.replace(b",", b", ", 1))


# --- endorsements -------------------------------------------------------------------------


def endorse_into(sealed: SealedSequence, ca: str = "ethics-board") -> SealedSequence:
    return sealed.with_endorsement(
        endorse(sealed, CA_KEY, ca=ca, claims={"fair": True, "checked": ["model"]})
    )


def test_endorsement_verifies_with_trusted_ca() -> None:
    sealed = endorse_into(make())
    verifier = SequenceVerifier.for_sealed(sealed, PUB, {"ethics-board": CA_KEY.public_key()})
    assert verifier.endorsed_by == {"ethics-board"}
    assert verify_whole(sealed, PUB, {"ethics-board": CA_KEY.public_key()})[-1].last


def test_endorsement_failures() -> None:
    sealed = endorse_into(make())
    with pytest.raises(UntrustedCAError):
        SequenceVerifier.for_sealed(sealed, PUB)
    with pytest.raises(UntrustedCAError):
        SequenceVerifier.for_sealed(sealed, PUB, {"other-ca": CA_KEY.public_key()})
    with pytest.raises(EndorsementError):  # right name, wrong key
        SequenceVerifier.for_sealed(
            sealed, PUB, {"ethics-board": Ed25519PrivateKey.generate().public_key()}
        )
    altered = sealed.endorsements[0].model_copy(update={"claims": {"fair": False}})
    forged = sealed.model_copy(update={"endorsements": (altered,)})
    with pytest.raises(EndorsementError):
        SequenceVerifier.for_sealed(forged, PUB, {"ethics-board": CA_KEY.public_key()})
    # An endorsement of one header does not transfer to another.
    other = make().model_copy(update={"endorsements": sealed.endorsements})
    with pytest.raises(EndorsementError):
        SequenceVerifier.for_sealed(other, PUB, {"ethics-board": CA_KEY.public_key()})


def test_endorse_refuses_garbage() -> None:
    with pytest.raises(ProtocolError):
        endorse(b"not a header", CA_KEY, ca="x", claims={})
    with pytest.raises(MalformedError):
        endorse(make(), CA_KEY, ca="x", claims={"n": float("nan")})


# --- whole sequences ----------------------------------------------------------------------


def test_verify_whole_detects_truncation_and_bad_files() -> None:
    sealed = make()
    revealed = verify_whole(sealed, PUB)
    assert [r.body for r in revealed] == BODIES
    truncated = sealed.model_copy(update={"traces": sealed.traces[:3], "bodies": sealed.bodies[:2]})
    with pytest.raises(IncompleteSequenceError):
        verify_whole(truncated, PUB)
    with pytest.raises(MalformedError):
        verify_whole(sealed.model_copy(update={"traces": sealed.traces[:3]}), PUB)
    with pytest.raises(TamperedTraceError, match="T_0"):
        verify_whole(sealed.model_copy(update={"traces": (bytes(64), *sealed.traces[1:])}), PUB)
