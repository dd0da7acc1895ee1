"""The whole-log verifier streams: the tree's right edge gives the same roots as the whole list
of leaves, and the memory it holds does not grow with the number of entries."""

from __future__ import annotations

import base64
import gc
import json
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st

from safeaccess.client.audit.checkpoint import Checkpoint, sign_checkpoint
from safeaccess.client.audit.merkle import Frontier, leaf_hash, node_hash, root_of, split_point
from safeaccess.client.audit.records import encode_record
from safeaccess.client.audit.verify import AuditFailure, ExportSource, log_origin, verify_log

SERVER = "stream-centre"


def _mth(leaves: list[bytes]) -> bytes:
    """RFC 9162 §2.1.1 written as the recursion, independent of the iterative code."""
    if len(leaves) == 1:
        return leaves[0]
    k = split_point(len(leaves))
    return node_hash(_mth(leaves[:k]), _mth(leaves[k:]))


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=300))
def test_the_frontier_gives_the_root_of_every_prefix(n: int) -> None:
    leaves = [leaf_hash(i.to_bytes(4, "big")) for i in range(n)]
    frontier = Frontier()
    for size, leaf in enumerate(leaves, start=1):
        frontier.append(leaf)
        assert frontier.size == size
        assert frontier.root() == _mth(leaves[:size])  # root() does not disturb what follows
    assert root_of(iter(leaves)) == _mth(leaves)


def _record(index: int) -> bytes:
    """An administrative record the replay keeps no state for (a dropped claim)."""
    return encode_record(
        {
            "log": "safeaccess-audit",
            "version": 1,
            "index": index,
            "time": "2026-01-01T00:00:00.000000Z",
            "kind": "claim_dropped",
            "actor": "admin",
            "sequence": None,
            "step": None,
            "data": {"dataset": "d", "kind": "summary", "claim": f"c{index}"},
        }
    )


@dataclass
class _Generated:
    """A log source that makes its `size` records on the fly and never holds them."""

    size: int
    bad: int | None = None  # an entry served edited after signing
    server_id: str = SERVER
    server_key: Ed25519PublicKey = field(init=False)
    checkpoint_note: str = field(init=False)
    served: int = 0

    def __post_init__(self) -> None:
        key = Ed25519PrivateKey.generate()
        self.server_key = key.public_key()
        root = root_of(leaf_hash(_record(i)) for i in range(self.size))
        checkpoint = Checkpoint(log_origin(SERVER), self.size, root, int(time.time()))
        self.checkpoint_note = sign_checkpoint(checkpoint, SERVER, key)

    def entries(self, size: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        for i in range(size):
            raw = _record(i)
            if i == self.bad:
                raw = raw.replace(b'"claim":"c', b'"claim":"x', 1)
            self.served += 1
            yield i, raw, None

    def inclusion(self, index: int, size: int) -> list[bytes] | None:
        return None

    def consistency(self, size1: int, size2: int) -> list[bytes] | None:
        return None


def _peak(size: int) -> int:
    source = _Generated(size)
    gc.collect()
    tracemalloc.start()
    try:
        report = verify_log(source)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.size == size and report.kinds == {"claim_dropped": size}
    return peak


def test_memory_does_not_grow_with_the_log() -> None:
    small, large = _peak(500), _peak(5000)
    # Holding every record (or leaf hash) would cost ten times as much for ten times the log;
    # streaming holds one entry and the tree's right edge (a few more hashes).
    assert large < 1.5 * small, (small, large)


def test_an_edited_entry_is_still_caught_while_streaming() -> None:
    source = _Generated(300, bad=123)
    with pytest.raises(AuditFailure, match="do not hash to the checkpoint's root"):
        verify_log(source)
    # The root is checked once all were read; naming the entry (no proofs here) reads again.
    assert source.served >= 300


def test_a_malformed_export_line_is_named(tmp_path: Path) -> None:
    source = _Generated(3)
    header = {
        "format": "safeaccess-audit-export",
        "version": 1,
        "server_id": SERVER,
        "server_public_key": base64.b64encode(source.server_key.public_bytes_raw()).decode(),
        "checkpoint": source.checkpoint_note,
    }
    lines = [json.dumps(header).encode()]
    for index, raw, _ in source.entries(3):
        leaf = base64.b64encode(leaf_hash(raw))
        lines.append(b"%d %s %s" % (index, leaf, raw) if index != 1 else b"garbage")
    export = tmp_path / "log.export"
    export.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(AuditFailure, match="entry 1: the export line is not"):
        verify_log(ExportSource(export))
