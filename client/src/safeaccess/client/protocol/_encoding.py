"""Byte fields in JSON: base64 for opaque blobs, lowercase hex for traces (as T_0 in the header)."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

from safeaccess.client.protocol.words import TRACE_SIZE


def _b64_in(value: object) -> object:
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error:
            raise ValueError("must be standard base64") from None
    return value


def _hex_in(value: object) -> object:
    if isinstance(value, str):
        try:
            return bytes.fromhex(value)
        except ValueError:
            raise ValueError("must be hexadecimal") from None
    return value


def _trace_in(value: object) -> object:
    raw = _hex_in(value)
    if isinstance(raw, bytes) and len(raw) != TRACE_SIZE:
        raise ValueError(f"a trace is {TRACE_SIZE} bytes")
    return raw


B64Bytes = Annotated[
    bytes,
    BeforeValidator(_b64_in),
    PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str),
]
TraceBytes = Annotated[
    bytes,
    BeforeValidator(_trace_in),
    PlainSerializer(lambda b: b.hex(), return_type=str),
]
