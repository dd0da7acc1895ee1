"""decode_record accepts exactly the canonical (RFC 8785) bytes of a record."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785

from safeaccess.client.audit.records import RecordError, decode_record


def _fields(value: Any) -> dict[str, Any]:
    return {
        "log": "safeaccess-audit",
        "version": 1,
        "index": 7,
        "time": "2026-01-01T00:00:00.000000Z",
        "kind": "checks",
        "actor": "server",
        "sequence": None,
        "step": None,
        "data": {"share": value, "note": "caf\u00e9 \U0001f600"},
    }


@pytest.mark.parametrize("value", [0.5, 1.5e-3, 123456.25, 1e21, 1e-7, 2.0, 7])
def test_the_canonical_bytes_decode(value: Any) -> None:
    raw = rfc8785.dumps(_fields(value))
    assert decode_record(raw).data["share"] == value


@pytest.mark.parametrize(
    ("literal", "canonical"),
    [(b"2.0", b"2"), (b"1e2", b"100"), (b"1.5E-3", b"0.0015")],
)
def test_a_float_written_otherwise_is_refused(literal: bytes, canonical: bytes) -> None:
    raw = rfc8785.dumps(_fields(0.25)).replace(b"0.25", literal)
    with pytest.raises(RecordError, match="canonical"):
        decode_record(raw)
    # ... and the same record written canonically decodes, so the flag is per record.
    decode_record(rfc8785.dumps(_fields(0.25)).replace(b"0.25", canonical))


def test_bytes_that_are_not_utf8_are_refused() -> None:
    raw = rfc8785.dumps(_fields(1)).replace("caf\u00e9".encode(), b"caf\xe9")
    with pytest.raises(RecordError, match="not an audit record"):
        decode_record(raw)
