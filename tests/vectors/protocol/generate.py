"""Generate the published binding-sequence test vectors (vectors.json next to this file).

Run `python tests/vectors/protocol/generate.py` to rewrite the file; the test suite recomputes
the vectors and fails if the file and the implementation ever disagree. Everything random in the
protocol (keys, locators, nonces, times) is fixed here, so any implementation can reproduce every
byte. Keys are derived from fixed labels and are public: never use them for anything real.
"""

from __future__ import annotations

import hashlib
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.keys import public_key_raw
from safeaccess.client.protocol import (
    body_digest,
    encode_word,
    endorse,
    endorsement_message,
    seal,
    trace_chain,
)

VECTORS_PATH = Path(__file__).with_name("vectors.json")


def _seed(label: str) -> bytes:
    return hashlib.sha256(f"safeaccess protocol test vector: {label}".encode()).digest()


def _label_bytes(label: str, size: int) -> bytes:
    return hashlib.sha256(label.encode()).digest()[:size]


RESEARCHER_SEED = _seed("researcher")
CA_SEED = _seed("certification authority")

CASES: list[dict[str, Any]] = [
    {
        "name": "one-step",
        "researcher": "alice@uni.example",
        "project": "P-2026-001",
        "dataset": "census-demo",
        "server": "sac.example",
        "created": "2026-01-15T09:30:00Z",
        "expires": "2026-02-14T09:30:00Z",
        "bodies": ['{"kind":"frequency_table","rows":["region"]}'],
        "endorsements": [],
    },
    {
        "name": "three-steps-endorsed",
        "researcher": "alice@uni.example",
        "project": "P-2026-001",
        "dataset": "census-demo",
        "server": "sac.example",
        "created": "2026-01-15T10:00:00Z",
        "expires": "2026-01-22T10:00:00Z",
        "bodies": [
            '{"kind":"frequency_table","rows":["region","sex"]}',
            '{"kind":"summary","variables":["income"],"where":"age >= 18"}',
            '{"formula":"income ~ age + sex","kind":"regression","model":"ols"}',
        ],
        "endorsements": [
            {
                "ca": "ethics-board.example",
                "claims": {"certified": ["explainability"], "ref": "EB-7"},
            }
        ],
    },
    {
        "name": "five-steps-unicode",
        "researcher": "josé.garcía",
        "project": "Zürich ✓",
        "dataset": "health-2025",
        "server": "tre.example:8443",
        "created": "2026-03-01T00:00:00Z",
        "expires": "2027-03-01T00:00:00Z",
        "bodies": ["a", "", "é", '{"kind":"script","code":"print(1)"}', "last"],
        "endorsements": [],
    },
]


def _time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _case_vector(case: dict[str, Any]) -> dict[str, Any]:
    researcher_key = Ed25519PrivateKey.from_private_bytes(RESEARCHER_SEED)
    ca_key = Ed25519PrivateKey.from_private_bytes(CA_SEED)
    name = case["name"]
    bodies = [b.encode("utf-8") for b in case["bodies"]]
    locators = [_label_bytes(f"{name} locator {j}", 16) for j in range(1, len(bodies) + 1)]
    nonce = _label_bytes(f"{name} nonce", 16)
    sealed = seal(
        bodies,
        researcher_key,
        researcher=case["researcher"],
        project=case["project"],
        dataset=case["dataset"],
        server=case["server"],
        created=_time(case["created"]),
        expires=_time(case["expires"]),
        locators=locators,
        nonce=nonce,
    )
    words = [
        encode_word(j, body_digest(b), loc)
        for j, (b, loc) in enumerate(zip(bodies, locators, strict=True), 1)
    ]
    endorsements = []
    for spec in case["endorsements"]:
        e = endorse(sealed, ca_key, ca=spec["ca"], claims=spec["claims"])
        endorsements.append(
            {
                "ca": e.ca,
                "claims": spec["claims"],
                "message": endorsement_message(sealed.header, e.ca, spec["claims"]).decode(),
                "signature": e.signature.hex(),
            }
        )
    return {
        "name": name,
        "inputs": {
            "researcher": case["researcher"],
            "project": case["project"],
            "dataset": case["dataset"],
            "server": case["server"],
            "created": case["created"],
            "expires": case["expires"],
            "nonce": nonce.hex(),
            "locators": [loc.hex() for loc in locators],
            "bodies_utf8": case["bodies"],
        },
        "body_digests": [body_digest(b).hex() for b in bodies],
        "words": [w.hex() for w in words],
        "traces": [t.hex() for t in sealed.traces],
        "header_utf8": sealed.header.decode("utf-8"),
        "signature": sealed.signature.hex(),
        "endorsements": endorsements,
    }


def _negative_vectors(first: dict[str, Any]) -> list[dict[str, Any]]:
    """Reveals a verifier must reject, as (previous trace, step, trace, body, expected error)."""
    traces = [bytes.fromhex(t) for t in first["traces"]]
    bodies = [b.encode() for b in first["inputs"]["bodies_utf8"]]
    flipped = bytearray(traces[1])
    flipped[17] ^= 0x01
    # A well-formed chain whose first word claims index 2: only the index check can catch it.
    wrong_index = trace_chain([encode_word(2, body_digest(bodies[0]), bytes(16))])
    return [
        {
            "description": "one bit of T_1 flipped",
            "error": "tampered_trace",
            "previous_trace": traces[0].hex(),
            "step": 1,
            "trace": bytes(flipped).hex(),
            "body_utf8": bodies[0].decode(),
        },
        {
            "description": "body replaced by another analysis",
            "error": "body_digest",
            "previous_trace": traces[0].hex(),
            "step": 1,
            "trace": traces[1].hex(),
            "body_utf8": '{"kind":"frequency_table","rows":["postcode"]}',
        },
        {
            "description": "valid word whose index is 2, revealed as step 1",
            "error": "index_mismatch",
            "previous_trace": wrong_index[0].hex(),
            "step": 1,
            "trace": wrong_index[1].hex(),
            "body_utf8": bodies[0].decode(),
        },
    ]


def build_vectors() -> dict[str, Any]:
    """The complete vector document."""
    cases = [_case_vector(case) for case in CASES]
    return {
        "description": (
            "safeaccess binding-sequence protocol v1 test vectors; see docs/protocol.md. "
            "Keys are Ed25519 seeds (RFC 8032 private keys), public and for testing only."
        ),
        "researcher_private_seed": RESEARCHER_SEED.hex(),
        "researcher_public_key": public_key_raw(
            Ed25519PrivateKey.from_private_bytes(RESEARCHER_SEED)
        ).hex(),
        "ca_private_seed": CA_SEED.hex(),
        "ca_public_key": public_key_raw(Ed25519PrivateKey.from_private_bytes(CA_SEED)).hex(),
        "cases": cases,
        "invalid_reveals": _negative_vectors(cases[1]),
    }


def render(vectors: dict[str, Any]) -> str:
    """The exact text of vectors.json."""
    return json.dumps(vectors, indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(render(build_vectors()), encoding="utf-8")
    sys.stdout.write(f"wrote {VECTORS_PATH.name}\n")
