"""The published test vectors: recomputed by our implementation and, independently, by hashlib."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from safeaccess.client.protocol import (
    BodyDigestError,
    IndexMismatchError,
    ProtocolError,
    SealedSequence,
    TamperedTraceError,
    verify_step,
    verify_whole,
)

VECTOR_DIR = Path(__file__).resolve().parents[1] / "vectors" / "protocol"
ERRORS: dict[str, type[ProtocolError]] = {
    "tampered_trace": TamperedTraceError,
    "body_digest": BodyDigestError,
    "index_mismatch": IndexMismatchError,
}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("protocol_vectors", VECTOR_DIR / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vectors() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((VECTOR_DIR / "vectors.json").read_text(encoding="utf-8"))
    return data


def test_vectors_file_matches_implementation() -> None:
    generator = _generator()
    on_disk = (VECTOR_DIR / "vectors.json").read_text(encoding="utf-8")
    assert generator.render(generator.build_vectors()) == on_disk


# --- independent recomputation from the documented layout (no safeaccess code below) ---------


def _sha512(data: bytes) -> bytes:
    return hashlib.sha512(data).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _word(j: int, body: bytes, locator: bytes) -> bytes:
    head = b"SAIW" + b"\x01" + j.to_bytes(4, "big") + hashlib.sha256(body).digest() + locator
    return head + hashlib.sha256(head).digest()[:7]


def _canonical(obj: dict[str, Any]) -> bytes:
    # For objects of ASCII keys, strings and small integers, RFC 8785 output equals this.
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_vectors_recomputed_independently(vectors: dict[str, Any]) -> None:
    researcher = Ed25519PrivateKey.from_private_bytes(
        bytes.fromhex(vectors["researcher_private_seed"])
    ).public_key()
    ca = Ed25519PublicKey.from_public_bytes(bytes.fromhex(vectors["ca_public_key"]))
    for case in vectors["cases"]:
        inputs = case["inputs"]
        bodies = [b.encode("utf-8") for b in inputs["bodies_utf8"]]
        locators = [bytes.fromhex(loc) for loc in inputs["locators"]]
        words = [
            _word(j, b, loc) for j, (b, loc) in enumerate(zip(bodies, locators, strict=True), 1)
        ]
        assert [w.hex() for w in words] == case["words"]
        assert case["body_digests"] == [hashlib.sha256(b).hexdigest() for b in bodies]
        # T_n = H(I_n), T_{j-1} = H(T_j) xor I_j, built back to front.
        traces = [_sha512(words[-1])]
        for word in reversed(words):
            traces.insert(0, _xor(_sha512(traces[0]), word))
        assert [t.hex() for t in traces] == case["traces"]
        header = _canonical(
            {
                "protocol": "safeaccess-sequence",
                "version": 1,
                "researcher": inputs["researcher"],
                "project": inputs["project"],
                "dataset": inputs["dataset"],
                "server": inputs["server"],
                "nonce": inputs["nonce"],
                "t0": traces[0].hex(),
                "created": inputs["created"],
                "expires": inputs["expires"],
            }
        )
        assert header == case["header_utf8"].encode("utf-8")
        researcher.verify(bytes.fromhex(case["signature"]), header)  # raises if wrong
        for endorsement in case["endorsements"]:
            message = _canonical(
                {
                    "protocol": "safeaccess-endorsement",
                    "version": 1,
                    "ca": endorsement["ca"],
                    "claims": endorsement["claims"],
                    "header_sha512": hashlib.sha512(header).hexdigest(),
                }
            )
            assert message == endorsement["message"].encode()
            ca.verify(bytes.fromhex(endorsement["signature"]), message)


def test_vectors_verify_with_our_verifier(vectors: dict[str, Any]) -> None:
    from datetime import datetime

    researcher = Ed25519PublicKey.from_public_bytes(bytes.fromhex(vectors["researcher_public_key"]))
    ca = Ed25519PublicKey.from_public_bytes(bytes.fromhex(vectors["ca_public_key"]))
    for case in vectors["cases"]:
        sealed = SealedSequence.model_validate(
            {
                "header": case["header_utf8"].encode(),
                "signature": bytes.fromhex(case["signature"]),
                "endorsements": [
                    {
                        "ca": e["ca"],
                        "claims": e["claims"],
                        "signature": bytes.fromhex(e["signature"]),
                    }
                    for e in case["endorsements"]
                ],
                "traces": [bytes.fromhex(t) for t in case["traces"]],
                "bodies": [b.encode() for b in case["inputs"]["bodies_utf8"]],
            }
        )
        at = datetime.fromisoformat(case["inputs"]["created"])
        revealed = verify_whole(sealed, researcher, {"ethics-board.example": ca}, at=at)
        assert [r.body.decode() for r in revealed] == case["inputs"]["bodies_utf8"]
        assert [r.last for r in revealed] == [False] * (len(revealed) - 1) + [True]


def test_invalid_reveal_vectors_are_rejected(vectors: dict[str, Any]) -> None:
    assert vectors["invalid_reveals"]
    for bad in vectors["invalid_reveals"]:
        with pytest.raises(ERRORS[bad["error"]]):
            verify_step(
                bytes.fromhex(bad["previous_trace"]),
                bad["step"],
                bytes.fromhex(bad["trace"]),
                bad["body_utf8"].encode(),
            )
