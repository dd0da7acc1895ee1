"""A versioned binary encoding of AuditState (no pickle), validated on load.

The layout itself and its checks are in `encoding.py`, which works on the state's fields so that
`AuditState.to_bytes` / `from_bytes` can use it without `state.py` importing this module (that
was an import cycle). The names below stay here for callers that import them from the codec.
"""

from __future__ import annotations

from safeaccess.rules.qss.encoding import (
    MAGIC,
    READABLE,
    VERSION,
    StateFormatError,
    decode_fields,
    encode_fields,
)
from safeaccess.rules.qss.state import AuditState

__all__ = ["MAGIC", "READABLE", "VERSION", "StateFormatError", "decode_state", "encode_state"]


def encode_state(state: AuditState) -> bytes:
    """The bytes of `state` (the same as `state.to_bytes()`)."""
    return encode_fields(state.fields())


def decode_state(data: bytes) -> AuditState:
    """The state encoded in `data` (the same as `AuditState.from_bytes(data)`); raise
    StateFormatError for bytes that are not a valid encoded state."""
    return AuditState(*decode_fields(data))
