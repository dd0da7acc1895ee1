"""A step's output commitment is computed once for the outcome record and its receipt, and is
always the commitment the client checks (`safeaccess.client.audit.records.commit`)."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from safeaccess.client.audit.records import commit
from safeaccess.server.audit import commitments


def test_the_same_output_object_is_committed_to_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def counted(salt: bytes, output: Any) -> str:
        calls.append(output)
        return commit(salt, output)

    monkeypatch.setattr(commitments, "commit", counted)
    salt = secrets.token_bytes(32)
    output = {"table": [[1, 2], [3, 4.5]], "labels": ["a", "b"]}
    first = commitments.commitment(salt, output)
    again = commitments.commitment(salt, output)
    assert first == again == commit(salt, output)
    assert len(calls) == 1
    # An equal object read back (a review, a stored step) is committed to afresh, and a changed
    # one gets its own commitment.
    copy = {"table": [[1, 2], [3, 4.5]], "labels": ["a", "b"]}
    assert commitments.commitment(salt, copy) == first
    assert len(calls) == 2
    other = {"table": [[1, 2], [3, 5]], "labels": ["a", "b"]}
    assert commitments.commitment(salt, other) == commit(salt, other) != first
    # Another salt never reuses a commitment, and nothing (None) is committed to as well.
    fresh = secrets.token_bytes(32)
    assert commitments.commitment(fresh, other) == commit(fresh, other)
    assert commitments.commitment(fresh, None) == commit(fresh, None)
