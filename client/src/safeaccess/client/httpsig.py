"""HTTP message signatures for safeaccess API requests: a small profile of RFC 9421 with Ed25519.

Every request the researcher sends is signed with her Ed25519 key. The signature covers the
method, the path, the query, a SHA-256 digest of the body (RFC 9530 `Content-Digest`), a creation
timestamp, a random nonce and (as the RFC 9421 `tag` parameter) the id of the server it is meant
for. The server rejects stale timestamps, nonces it has seen within the skew window and requests
tagged for another server, so a captured request cannot be replayed, here or at another centre
where the researcher uses the same key; no password or shared secret exists.

The signature base follows RFC 9421 section 2.5 (one `"name": value` line per component, then the
`"@signature-params"` line), so standard tooling can reproduce it. Both the signer (client) and the
verifier (server) live here so the two sides cannot drift apart.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

LABEL = "sa"
ALGORITHM = "ed25519"
COMPONENTS: tuple[str, ...] = ("@method", "@path", "@query", "content-digest")
DEFAULT_MAX_SKEW = 300

_KEYID = re.compile(r"^[A-Za-z0-9_.@-]{1,128}$")
_NONCE = re.compile(r"^[A-Za-z0-9_-]{16,128}$")
_TAG = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_INPUT = re.compile(
    r"^sa=(?P<value>\((?P<components>[^()]*)\)(?P<params>(?:;[a-z]+=(?:\"[^\"]*\"|\d+))*))$"
)
_PARAM = re.compile(r";([a-z]+)=(\"[^\"]*\"|\d+)")
_SIGNATURE = re.compile(r"^sa=:(?P<sig>[A-Za-z0-9+/=]+):$")
_DIGEST = re.compile(r"^sha-256=:(?P<digest>[A-Za-z0-9+/=]+):$")
_DUMMY_KEY: Ed25519PublicKey = Ed25519PrivateKey.generate().public_key()


class SignatureError(Exception):
    """A request signature could not be accepted; `code` is machine-readable."""

    code = "signature_invalid"


class SignatureMissing(SignatureError):
    code = "signature_missing"


class SignatureMalformed(SignatureError):
    code = "signature_malformed"


class DigestMismatch(SignatureError):
    code = "digest_mismatch"


class SignatureStale(SignatureError):
    code = "signature_stale"


class NonceReplayed(SignatureError):
    code = "nonce_replayed"


class UnknownKey(SignatureError):
    code = "unknown_key"


class BadSignature(SignatureError):
    code = "signature_invalid"


class WrongAudience(SignatureError):
    code = "wrong_server"


@dataclass(frozen=True)
class SignatureParams:
    """The parameters bound into a verified signature."""

    keyid: str
    created: int
    nonce: str
    tag: str | None = None


def valid_keyid(name: str) -> bool:
    """Whether `name` can sign requests (researcher names are the key ids)."""
    return bool(_KEYID.match(name))


def content_digest(body: bytes) -> str:
    """The RFC 9530 `Content-Digest` value (sha-256) of a body."""
    return "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode("ascii") + ":"


def _query_component(query: str) -> str:
    # RFC 9421 2.2.7: the query with its leading "?", or "?" alone when there is none.
    return "?" + query.lstrip("?")


def signature_base(method: str, path: str, query: str, digest: str, params_value: str) -> bytes:
    """The exact bytes that are signed (RFC 9421 section 2.5)."""
    values = {
        "@method": method.upper(),
        "@path": path,
        "@query": _query_component(query),
        "content-digest": digest,
    }
    lines = [f'"{name}": {values[name]}' for name in COMPONENTS]
    lines.append(f'"@signature-params": {params_value}')
    return "\n".join(lines).encode("utf-8")


def _params_value(keyid: str, created: int, nonce: str, tag: str | None = None) -> str:
    components = " ".join(f'"{c}"' for c in COMPONENTS)
    value = f'({components});created={created};nonce="{nonce}";keyid="{keyid}";alg="{ALGORITHM}"'
    return value + (f';tag="{tag}"' if tag is not None else "")


def sign_request(
    method: str,
    path: str,
    query: str,
    body: bytes,
    private_key: Ed25519PrivateKey,
    keyid: str,
    *,
    created: int | None = None,
    nonce: str | None = None,
    server: str | None = None,
) -> dict[str, str]:
    """Headers (`Content-Digest`, `Signature-Input`, `Signature`) that authenticate one request;
    `server` (the server id) binds the request to that server, which every other server refuses."""
    if not _KEYID.match(keyid):
        raise ValueError(f"key id {keyid!r} may only use letters, digits and _ . @ -")
    if server is not None and not _TAG.match(server):
        raise ValueError(f"server id {server!r} may only use letters, digits and _ . : -")
    nonce = nonce if nonce is not None else secrets.token_urlsafe(24)
    if not _NONCE.match(nonce):
        raise ValueError("nonce must be 16-128 URL-safe base64 characters")
    created = int(time.time()) if created is None else created
    digest = content_digest(body)
    params = _params_value(keyid, created, nonce, server)
    signature = private_key.sign(signature_base(method, path, query, digest, params))
    return {
        "Content-Digest": digest,
        "Signature-Input": f"{LABEL}={params}",
        "Signature": f"{LABEL}=:{base64.b64encode(signature).decode('ascii')}:",
    }


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = headers.get(name.lower())
    return value


def _parse_input(raw: str) -> tuple[str, SignatureParams]:
    match = _INPUT.match(raw.strip())
    if not match:
        raise SignatureMalformed(
            'Signature-Input is not of the form sa=("@method" ...);created=..;nonce=..;keyid=..'
        )
    components = tuple(c.strip('"') for c in match.group("components").split())
    if components != COMPONENTS:
        raise SignatureMalformed(
            "the signature must cover exactly " + ", ".join(COMPONENTS) + " in that order"
        )
    params: dict[str, str] = {}
    for name, value in _PARAM.findall(match.group("params")):
        if name in params:
            raise SignatureMalformed(f"signature parameter {name!r} appears twice")
        params[name] = value.strip('"')
    missing = {"created", "nonce", "keyid", "alg"} - params.keys()
    if missing:
        raise SignatureMalformed("signature parameters missing: " + ", ".join(sorted(missing)))
    if params["alg"] != ALGORITHM:
        raise SignatureMalformed(f"signature algorithm must be {ALGORITHM}")
    if not params["created"].isdigit():
        raise SignatureMalformed("'created' must be a Unix timestamp")
    if not _KEYID.match(params["keyid"]) or not _NONCE.match(params["nonce"]):
        raise SignatureMalformed("'keyid' or 'nonce' has characters that are not allowed")
    tag = params.get("tag")
    if tag is not None and not _TAG.match(tag):
        raise SignatureMalformed("'tag' (the server id) has characters that are not allowed")
    return match.group("value"), SignatureParams(
        keyid=params["keyid"], created=int(params["created"]), nonce=params["nonce"], tag=tag
    )


def verify_request(
    method: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    resolve_key: Callable[[str], Ed25519PublicKey | None],
    remember_nonce: Callable[[str, str, int], bool],
    now: float | None = None,
    max_skew: int = DEFAULT_MAX_SKEW,
    server: str | None = None,
) -> SignatureParams:
    """Verify a signed request and return its parameters, or raise a SignatureError subclass.

    `resolve_key(keyid)` returns the public key of a known signer or None. `remember_nonce(keyid,
    nonce, expires_at)` records a nonce and returns False when it was already recorded; it is
    called only after the signature verifies, so forged requests cannot fill the nonce store or
    burn a legitimate client's nonces. With `server` (this server's id), a request tagged for
    another server is refused; an untagged one is accepted (clients before the tag).
    """
    raw_input = _header(headers, "Signature-Input")
    raw_signature = _header(headers, "Signature")
    raw_digest = _header(headers, "Content-Digest")
    if not raw_input or not raw_signature or not raw_digest:
        raise SignatureMissing(
            "the request is not signed: send Content-Digest, Signature-Input and Signature headers "
            "(the safeaccess client does this for you)"
        )
    params_value, params = _parse_input(raw_input)
    sig_match = _SIGNATURE.match(raw_signature.strip())
    digest_match = _DIGEST.match(raw_digest.strip())
    if not sig_match or not digest_match:
        raise SignatureMalformed("Signature or Content-Digest header is malformed")
    if raw_digest.strip() != content_digest(body):
        raise DigestMismatch(
            "the body does not match its Content-Digest; it was altered in transit"
        )
    current = time.time() if now is None else now
    if abs(current - params.created) > max_skew:
        raise SignatureStale(
            f"the request was signed at {params.created}, more than {max_skew} s from the server's "
            "clock; check your clock and send a freshly signed request"
        )
    public_key = resolve_key(params.keyid)
    # An unknown signer is checked against a throwaway key, so that the answer takes as long as
    # for a known signer with a bad signature: the time must not tell who is registered.
    try:
        signature = base64.b64decode(sig_match.group("sig"), validate=True)
        (public_key or _DUMMY_KEY).verify(
            signature, signature_base(method, path, query, raw_digest.strip(), params_value)
        )
        verified = True
    except (ValueError, _CryptoInvalidSignature):
        verified = False
    if public_key is None:
        raise UnknownKey(f"no researcher {params.keyid!r} is registered on this server")
    if not verified:
        raise BadSignature(
            f"the request signature does not verify with {params.keyid}'s registered key"
        )
    if server is not None and params.tag is not None and params.tag != server:
        raise WrongAudience(
            f"the request was signed for server {params.tag!r}; this server is {server!r}"
        )
    if not remember_nonce(params.keyid, params.nonce, params.created + max_skew + 1):
        raise NonceReplayed("this request was already received once (nonce replayed)")
    return params
