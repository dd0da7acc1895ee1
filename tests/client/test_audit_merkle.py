"""RFC 9162 proofs: every case of the transparency-dev vectors, and the log's own proofs."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
from pathlib import Path

import pytest

from safeaccess.client.audit.merkle import (
    EMPTY_ROOT,
    ProofError,
    consistency_ranges,
    cover,
    inclusion_ranges,
    leaf_hash,
    node_hash,
    root_of,
    verify_consistency,
    verify_inclusion,
)

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "rfc9162"
INCLUSION = sorted((VECTORS / "inclusion").rglob("*.json"))
CONSISTENCY = sorted((VECTORS / "consistency").rglob("*.json"))


def _b64(value: str) -> bytes:
    return base64.b64decode(value)


def test_the_vectors_are_all_there() -> None:
    assert len(INCLUSION) >= 80 and len(CONSISTENCY) >= 90


@pytest.mark.parametrize("path", INCLUSION, ids=lambda p: str(p.relative_to(VECTORS)))
def test_inclusion_vector(path: Path) -> None:
    case = json.loads(path.read_text())
    proof = [_b64(p) for p in case["proof"] or []]

    def run() -> None:
        verify_inclusion(
            case["leafIdx"], case["treeSize"], _b64(case["leafHash"]), proof, _b64(case["root"])
        )

    if case["wantErr"]:
        with pytest.raises(ProofError):
            run()
    else:
        run()


@pytest.mark.parametrize("path", CONSISTENCY, ids=lambda p: str(p.relative_to(VECTORS)))
def test_consistency_vector(path: Path) -> None:
    case = json.loads(path.read_text())
    proof = [_b64(p) for p in case["proof"] or []]

    def run() -> None:
        verify_consistency(
            case["size1"], case["size2"], _b64(case["root1"]), _b64(case["root2"]), proof
        )

    if case["wantErr"]:
        with pytest.raises(ProofError):
            run()
    else:
        run()


# The RFC 6962 reference leaves and roots (independent of this code: published test data).
RFC6962_LEAVES = [
    b"",
    b"\x00",
    b"\x10",
    b"\x20\x21",
    b"\x30\x31",
    b"\x40\x41\x42\x43",
    b"\x50\x51\x52\x53\x54\x55\x56\x57",
    b"\x60\x61\x62\x63\x64\x65\x66\x67\x68\x69\x6a\x6b\x6c\x6d\x6e\x6f",
]
RFC6962_ROOT8 = "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"


def test_root_matches_the_reference_tree() -> None:
    assert root_of([leaf_hash(x) for x in RFC6962_LEAVES]).hex() == RFC6962_ROOT8
    assert root_of([]) == EMPTY_ROOT == hashlib.sha256(b"").digest()
    a, b, c = (leaf_hash(bytes([i])) for i in range(3))
    assert root_of([a, b, c]) == node_hash(node_hash(a, b), c)


def _store(tmp_path: Path, n: int):  # type: ignore[no-untyped-def]
    from safeaccess.server.store import Store, auditlog

    store = Store(f"sqlite:///{tmp_path / 'log.db'}")
    leaves = []
    for i in range(n):
        with store.transaction() as s:
            auditlog.append(s, "test", "tester", {"i": i})
        with store.transaction() as s:
            leaves.append(auditlog.leaf_hashes(s, i, i + 1)[i])
    return store, leaves


def test_the_logs_proofs_verify_at_every_size(tmp_path: Path) -> None:
    from safeaccess.server.store import auditlog

    store, leaves = _store(tmp_path, 37)
    try:
        with store.transaction() as s:
            for size in range(1, 38):
                root = auditlog.root(s, size)
                assert root == root_of(leaves[:size])
                for index in range(size):
                    proof = auditlog.inclusion_proof(s, index, size)
                    verify_inclusion(index, size, leaves[index], proof, root)
                for size1 in range(1, size + 1):
                    proof = auditlog.consistency_proof(s, size1, size)
                    verify_consistency(size1, size, root_of(leaves[:size1]), root, proof)
            # A proof for another entry or a shorter tree does not pass for this one.
            with pytest.raises(ProofError):
                verify_inclusion(3, 37, leaves[4], auditlog.inclusion_proof(s, 3, 37), root)
            with pytest.raises(ProofError):
                verify_consistency(
                    5, 37, root_of(leaves[:6]), root, auditlog.consistency_proof(s, 5, 37)
                )
    finally:
        store.close()


def test_proof_ranges_alone_make_proofs_that_verify() -> None:
    # The ranges are pure arithmetic: hashing each range of the leaves directly must give proofs
    # the verifier accepts, and each range's cover must be perfect subtrees that tile it.
    leaves = [leaf_hash(bytes([i])) for i in range(33)]
    for size in range(1, 34):
        root = root_of(leaves[:size])
        for index in range(size):
            ranges = inclusion_ranges(index, size)
            verify_inclusion(
                index, size, leaves[index], [root_of(leaves[a:b]) for a, b in ranges], root
            )
        assert consistency_ranges(0, size) == consistency_ranges(size, size) == []
        for size1 in range(1, size + 1):
            ranges = consistency_ranges(size1, size)
            proof = [root_of(leaves[a:b]) for a, b in ranges]
            verify_consistency(size1, size, root_of(leaves[:size1]), root, proof)
            for a, b in ranges:
                tiles = [(i << level, (i + 1) << level) for level, i in cover(a, b)]
                assert tiles[0][0] == a and tiles[-1][1] == b
                assert all(x[1] == y[0] for x, y in itertools.pairwise(tiles))
