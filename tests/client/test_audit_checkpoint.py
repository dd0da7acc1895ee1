"""Signed checkpoints (C2SP signed-note / tlog-checkpoint), commitments and record decoding."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from safeaccess.client.audit.checkpoint import (
    Checkpoint,
    CheckpointError,
    key_hash,
    parse_checkpoint,
    sign_checkpoint,
    verify_checkpoint,
)
from safeaccess.client.audit.records import RecordError, commit, decode_record, opens

KEY = Ed25519PrivateKey.generate()
CP = Checkpoint(origin="safeaccess/c1/audit", size=42, root=bytes(range(32)), time=1_700_000_000)


def test_the_note_has_the_standard_layout_and_verifies() -> None:
    note = sign_checkpoint(CP, "c1", KEY)
    text, sig_line = note.split("\n\n")
    assert (
        text
        == "safeaccess/c1/audit\n42\n" + base64.b64encode(CP.root).decode() + "\ntime 1700000000"
    )
    assert sig_line.startswith("\u2014 c1 ") and sig_line.endswith("\n")
    blob = base64.b64decode(sig_line.split(" ")[2])
    # key hash: SHA-256(name || "\n" || 0x01 || raw public key)[:4], then the signature
    raw = KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert (
        blob[:4]
        == hashlib.sha256(b"c1\n\x01" + raw).digest()[:4]
        == key_hash("c1", KEY.public_key())
    )
    KEY.public_key().verify(blob[4:], (text + "\n").encode())
    assert verify_checkpoint(note, "c1", KEY.public_key()) == CP


def test_altered_forged_or_malformed_notes_are_refused() -> None:
    note = sign_checkpoint(CP, "c1", KEY)
    with pytest.raises(CheckpointError, match="altered"):
        verify_checkpoint(note.replace("\n42\n", "\n43\n"), "c1", KEY.public_key())
    other = sign_checkpoint(CP, "c1", Ed25519PrivateKey.generate())
    with pytest.raises(CheckpointError, match="not signed by"):
        verify_checkpoint(other, "c1", KEY.public_key())
    with pytest.raises(CheckpointError, match="not signed by"):
        verify_checkpoint(note, "c2", KEY.public_key())
    for bad in ("", "x\n1\n", note.replace("time ", "tame "), note.replace("\n\n", "\n")):
        with pytest.raises(CheckpointError):
            parse_checkpoint(bad)


def test_a_commitment_opens_only_with_its_salt_and_output() -> None:
    salt, other_salt = b"\x01" * 32, b"\x02" * 32
    output = {"values": [[12, 30]], "labels": ["a"]}
    c = commit(salt, output)
    assert c == hashlib.sha256(salt + b'{"labels":["a"],"values":[[12,30]]}').hexdigest()
    assert opens(c, salt, {"labels": ["a"], "values": [[12, 30]]})
    assert not opens(c, other_salt, output)
    assert not opens(c, salt, {"values": [[12, 31]], "labels": ["a"]})
    assert c != hashlib.sha256(b'{"labels":["a"],"values":[[12,30]]}').hexdigest()


RECORD = (
    b'{"actor":"a","data":{"x":0.25,"y":[1,2]},"index":3,"kind":"k","log":"safeaccess-audit",'
    b'"sequence":null,"step":null,"time":"t","version":1}'
)


def test_records_must_be_canonical() -> None:
    assert decode_record(RECORD).data == {"x": 0.25, "y": [1, 2]}
    for variant in (
        RECORD.replace(b'"x":0.25', b'"x":2.5e-1'),  # another spelling of the same number
        RECORD.replace(b'"actor":"a",', b'"actor": "a",'),  # whitespace
        RECORD.replace(b'{"actor":"a",', b'{"index":3,"actor":"a",'),  # a duplicate key
        RECORD.replace(b'"data":{"x":0.25,"y"', b'"data":{"y":[1,2],"x":0.25,"z"'),
        RECORD.replace(b'"x":0.25', b'"x":2.0'),
    ):
        with pytest.raises(RecordError):
            decode_record(variant)
