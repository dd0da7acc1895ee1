"""RFC 9162 (Certificate Transparency v2) Merkle tree hashing and proof verification.

Leaf hash `SHA-256(0x00 || record)`, interior node `SHA-256(0x01 || left || right)`; the tree over
n leaves splits at the largest power of two below n (RFC 9162 §2.1.1). Verification follows the
algorithms of §2.1.3.2 (inclusion) and §2.1.4.2 (consistency) step by step, so that a proof with a
component too many or too few, a wrong index or size, or a flipped bit is rejected. Generating
proofs is the log's job (`safeaccess.server.audit.log`); `root_of` is here for auditors who hold
the whole log and recompute its root.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


class ProofError(ValueError):
    """A Merkle proof does not verify; the message says which check failed."""


def leaf_hash(record: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + record).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def split_point(n: int) -> int:
    """The largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


class Frontier:
    """The right edge of a growing RFC 9162 tree: one hash per perfect subtree (at most
    log2(n) + 1 of them), so a verifier streaming a million entries recomputes the root in
    O(n) time and O(log n) memory instead of holding every leaf hash."""

    def __init__(self) -> None:
        self.size = 0
        self._stack: list[tuple[int, bytes]] = []  # (height, hash) of completed perfect subtrees

    def append(self, leaf: bytes) -> None:
        """Add the next leaf hash (already `leaf_hash`ed)."""
        height, current = 0, leaf
        while self._stack and self._stack[-1][0] == height:
            _, left = self._stack.pop()
            current = node_hash(left, current)
            height += 1
        self._stack.append((height, current))
        self.size += 1

    def root(self) -> bytes:
        """MTH of the leaves appended so far."""
        if not self._stack:
            return EMPTY_ROOT
        # Fold the right edge: smaller subtrees on the right combine first (RFC 9162 split).
        root = self._stack[-1][1]
        for _, left in reversed(self._stack[:-1]):
            root = node_hash(left, root)
        return root


def root_of(leaf_hashes: Iterable[bytes]) -> bytes:
    """MTH over leaf hashes (already `leaf_hash`ed), iteratively in O(n), no recursion."""
    frontier = Frontier()
    for h in leaf_hashes:
        frontier.append(h)
    return frontier.root()


def _check_hash(value: bytes, what: str) -> None:
    if len(value) != HASH_SIZE:
        raise ProofError(f"{what} is {len(value)} bytes, not a SHA-256 hash")


def verify_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes
) -> None:
    """RFC 9162 §2.1.3.2: leaf hash `leaf` is entry `index` of the tree of `size` with `root`."""
    _check_hash(leaf, "the leaf hash")
    _check_hash(root, "the root hash")
    if index < 0 or index >= size:
        raise ProofError(f"entry {index} is outside a tree of {size} entries")
    fn, sn = index, size - 1
    r = leaf
    for p in proof:
        _check_hash(p, "a proof component")
        if sn == 0:
            raise ProofError("the inclusion proof has more components than the tree has levels")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the inclusion proof has fewer components than the tree has levels")
    if r != root:
        raise ProofError(f"entry {index} does not lead to the root of the tree of {size} entries")


def verify_consistency(
    size1: int, size2: int, root1: bytes, root2: bytes, proof: Sequence[bytes]
) -> None:
    """RFC 9162 §2.1.4.2: the tree of `size1` with `root1` is a prefix of the tree of `size2`."""
    if size1 < 0 or size2 < size1:
        raise ProofError(f"a log of {size1} entries cannot grow into {size2} entries")
    if size1 == size2:
        if proof:
            raise ProofError("equal sizes need an empty consistency proof")
        if root1 != root2:
            raise ProofError(f"two different roots for the same size {size1}: the log forked")
        if size1 == 0 and root1 != EMPTY_ROOT:
            raise ProofError("the root of the empty tree must be SHA-256 of the empty string")
        return
    if size1 == 0:
        # Nothing to prove from an empty tree: a proof "from 0" is a caller's mistake.
        raise ProofError("no consistency proof exists from the empty tree")
    _check_hash(root1, "the first root")
    _check_hash(root2, "the second root")
    if not proof:
        raise ProofError("the consistency proof is empty")
    for p in proof:
        _check_hash(p, "a proof component")
    path = list(proof)
    if size1 & (size1 - 1) == 0:  # size1 is an exact power of two
        path.insert(0, root1)
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof has more components than needed")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the consistency proof has fewer components than needed")
    if fr != root1:
        raise ProofError(
            f"the log's first {size1} entries do not hash to the earlier root: history was "
            "rewritten"
        )
    if sr != root2:
        raise ProofError(f"the consistency proof does not lead to the root of size {size2}")
