"""Request signatures: what verifies, and every way a request is refused."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.httpsig import (
    BadSignature,
    DigestMismatch,
    NonceReplayed,
    SignatureMalformed,
    SignatureMissing,
    SignatureParams,
    SignatureStale,
    UnknownKey,
    WrongAudience,
    content_digest,
    sign_request,
    verify_request,
)

KEY = Ed25519PrivateKey.generate()
NOW = 1_800_000_000


class Nonces:
    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], int] = {}

    def __call__(self, keyid: str, nonce: str, expires: int) -> bool:
        if (keyid, nonce) in self.seen:
            return False
        self.seen[(keyid, nonce)] = expires
        return True


def _verify(
    headers: dict[str, str], body: bytes = b"{}", *, now: float = NOW, **kw: object
) -> SignatureParams:
    nonces = kw.pop("nonces", Nonces())
    return verify_request(
        kw.pop("method", "POST"),  # type: ignore[arg-type]
        kw.pop("path", "/v1/sequences"),  # type: ignore[arg-type]
        kw.pop("query", ""),  # type: ignore[arg-type]
        headers,
        body,
        resolve_key=lambda k: KEY.public_key() if k == "ada" else None,
        remember_nonce=nonces,  # type: ignore[arg-type]
        now=now,
        max_skew=300,
        server=kw.pop("server", None),  # type: ignore[arg-type]
    )


def _sign(body: bytes = b"{}", **kw: object) -> dict[str, str]:
    return sign_request(
        "POST",
        "/v1/sequences",
        "",
        body,
        KEY,
        "ada",
        created=NOW,
        **kw,  # type: ignore[arg-type]
    )


def test_content_digest_is_rfc9530_sha256() -> None:
    expected = base64.b64encode(hashlib.sha256(b"hello").digest()).decode()
    assert content_digest(b"hello") == f"sha-256=:{expected}:"


def test_signed_request_verifies_and_names_its_signer() -> None:
    params = _verify(_sign())
    assert params.keyid == "ada" and params.created == NOW


def test_signature_base_is_the_rfc9421_form() -> None:
    headers = _sign(nonce="n" * 20)
    base = (
        '"@method": POST\n"@path": /v1/sequences\n"@query": ?\n'
        f'"content-digest": {content_digest(b"{}")}\n'
        '"@signature-params": ("@method" "@path" "@query" "content-digest");'
        f'created={NOW};nonce="{"n" * 20}";keyid="ada";alg="ed25519"'
    ).encode()
    signature = base64.b64decode(headers["Signature"][4:-1])
    KEY.public_key().verify(signature, base)  # raises if the base differs


def test_replayed_nonce_is_refused() -> None:
    nonces = Nonces()
    headers = _sign()
    _verify(headers, nonces=nonces)
    with pytest.raises(NonceReplayed):
        _verify(headers, nonces=nonces)


def test_stale_and_future_timestamps_are_refused() -> None:
    with pytest.raises(SignatureStale):
        _verify(_sign(), now=NOW + 301)
    with pytest.raises(SignatureStale):
        _verify(_sign(), now=NOW - 301)
    _verify(_sign(), now=NOW + 299)


def test_tampered_body_fails_the_digest() -> None:
    with pytest.raises(DigestMismatch):
        _verify(_sign(b'{"a":1}'), b'{"a":2}')


def test_a_recomputed_digest_does_not_help_a_tamperer() -> None:
    headers = _sign(b'{"a":1}')
    headers["Content-Digest"] = content_digest(b'{"a":2}')
    with pytest.raises(BadSignature):
        _verify(headers, b'{"a":2}')


@pytest.mark.parametrize(
    ("field", "value"),
    [("method", "PUT"), ("path", "/v1/sequences/x"), ("query", "a=1")],
)
def test_method_path_and_query_are_covered(field: str, value: str) -> None:
    with pytest.raises(BadSignature):
        _verify(_sign(), **{field: value})  # type: ignore[arg-type]


def test_unknown_signer_and_other_key_are_refused() -> None:
    other = sign_request("POST", "/v1/sequences", "", b"{}", KEY, "bob", created=NOW)
    with pytest.raises(UnknownKey):
        _verify(other)
    forged = sign_request(
        "POST", "/v1/sequences", "", b"{}", Ed25519PrivateKey.generate(), "ada", created=NOW
    )
    with pytest.raises(BadSignature):
        _verify(forged)


def test_a_forged_request_does_not_burn_the_nonce() -> None:
    nonces = Nonces()
    good = _sign(nonce="x" * 24)
    forged = sign_request(
        "POST",
        "/v1/sequences",
        "",
        b"{}",
        Ed25519PrivateKey.generate(),
        "ada",
        created=NOW,
        nonce="x" * 24,
    )
    with pytest.raises(BadSignature):
        _verify(forged, nonces=nonces)
    _verify(good, nonces=nonces)


def test_missing_and_malformed_headers() -> None:
    with pytest.raises(SignatureMissing):
        _verify({})
    headers = _sign()
    headers["Signature-Input"] = headers["Signature-Input"].replace('"@query" ', "")
    with pytest.raises(SignatureMalformed):
        _verify(headers)
    headers = _sign()
    headers["Signature-Input"] = headers["Signature-Input"].replace("ed25519", "hmac-sha256")
    with pytest.raises(SignatureMalformed):
        _verify(headers)


def test_a_request_tagged_for_another_server_is_refused() -> None:
    # A centre that receives a researcher's signed request must not be able to replay it at
    # another centre where she uses the same key.
    tagged = _sign(server="centre-a")
    assert _verify(tagged, server="centre-a").tag == "centre-a"
    with pytest.raises(WrongAudience):
        _verify(tagged, server="centre-b")
    # The tag is signed: rewriting it breaks the signature.
    rewritten = dict(tagged)
    rewritten["Signature-Input"] = tagged["Signature-Input"].replace('"centre-a"', '"centre-b"')
    with pytest.raises(BadSignature):
        _verify(rewritten, server="centre-b")
    # Untagged requests (older clients) are still accepted.
    assert _verify(_sign(), server="centre-b").tag is None


def test_an_unknown_signer_costs_a_signature_verification_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Refusing an unknown key id before any Ed25519 verification answered faster than refusing a
    # registered one signed with another key: the time told who is registered.
    from cryptography.exceptions import InvalidSignature

    from safeaccess.client import httpsig

    verified: list[bytes] = []

    class Spy:
        def verify(self, signature: bytes, data: bytes) -> None:
            verified.append(data)
            raise InvalidSignature

    monkeypatch.setattr(httpsig, "_DUMMY_KEY", Spy())
    other = sign_request("POST", "/v1/sequences", "", b"{}", KEY, "bob", created=NOW)
    with pytest.raises(UnknownKey):
        _verify(other)
    assert len(verified) == 1 and b'"@method": POST' in verified[0]
