"""Canonical JSON (RFC 8785, JCS): the one function every signer, hasher and verifier calls.

`rfc8785.dumps` is the reference; it is pure Python and costs about 0.2 ms per 1 KB object,
which the server pays several times on every step and a verifier once per log entry. For the
values we actually sign (dicts with str keys, lists, str, bool, None, ints within the JSON-safe
range) the standard library's C encoder, with sorted keys, compact separators and no ASCII
escaping, produces the very same bytes:

- strings: both escape `"`, `\\`, `\\b \\f \\n \\r \\t` by their short forms and every other
  control character below U+0020 as `\\u00xx` (lower-case hex), and write everything else,
  U+007F, U+2028/U+2029 and characters beyond the BMP included, as raw UTF-8;
- integers: both write the decimal digits (RFC 8785 accepts only |n| <= 2^53 - 1);
- floats: the reference writes `repr(x)` re-formatted the ECMAScript way; when `repr(x)` has no
  exponent (about 1e-4 <= |x| < 1e16) and does not end in ".0" (x not integer-valued), that
  re-formatting leaves it unchanged, and `repr(x)` is what the C encoder writes. An
  integer-valued float below 2^53 in magnitude (counts in an output: 12.0; zero, negative zero)
  is written by the reference as the integer's digits (every integer there is a double of its
  own, so the shortest digits that round-trip are the integer's), which is what the C encoder
  writes for `int(x)`: such values are encoded from a copy with those floats made ints. Other
  floats (exponents, larger integer values, NaN, infinities) take the reference path;
- object keys: RFC 8785 sorts by UTF-16 code units, Python by code points. The two orders agree
  unless a key holds a character beyond U+FFFF (a surrogate pair, 0xD800-0xDBFF, sorts below
  U+E000-U+FFFF in UTF-16 but above them by code point), so such keys take the reference path.

Anything else (the other floats, whose number formats differ; big ints; non-str keys; tuples, subclasses,
other mappings; lone surrogates, which RFC 8785 rejects) goes to `rfc8785.dumps`, so the fast
path never decides a case it was not shown to decide. `tests/client/test_canonical.py` checks
byte equality with the library on thousands of generated values, adversarial keys and strings
included. A hand-written encoder, not another library: none we could find is both maintained
and faster while being exactly RFC 8785.
"""

from __future__ import annotations

import json
import math
from typing import Any

import rfc8785

CanonicalizationError = rfc8785.CanonicalizationError

_INT_MAX = 2**53 - 1
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


#: `_plain`'s answers: not for the fast path; for it as is; for it once `_as_ints` made its
#: integer-valued floats ints.
NO, YES, AS_INTS = 0, 1, 2


def _plain(value: Any) -> int:
    """Whether `value` is made only of the types the fast path is proved equal on (`YES`, or
    `AS_INTS` when it holds integer-valued floats that `_as_ints` must turn into ints first),
    else `NO`.

    Written as loops with the leaves checked inline: a function call per leaf would cost more
    than the encoding it saves. Recursion is bounded like the reference's (a RecursionError,
    for a cycle or deep nesting, sends the value to the reference, which raises it too)."""
    kind = type(value)
    if kind is dict:
        for key in value:
            # Code-point and UTF-16 order agree unless a key holds a character beyond U+FFFF.
            if type(key) is not str or not (key.isascii() or max(key) <= "\uffff"):
                return NO
        items: Any = value.values()
    elif kind is list:
        items = value
    elif kind is str or kind is bool or value is None:
        return YES
    elif kind is int:
        return YES if -_INT_MAX <= value <= _INT_MAX else NO
    elif kind is float:
        return YES if _fixed_float(value) else AS_INTS if _integral(value) else NO
    else:
        return NO
    found = YES
    for item in items:
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if not -_INT_MAX <= item <= _INT_MAX:
                return NO
        elif kind is float:
            if not _fixed_float(item):
                if not _integral(item):
                    return NO
                found = AS_INTS
        else:
            inner = _plain(item)
            if inner == NO:
                return NO
            found = max(found, inner)
    return found


def _integral(value: float) -> bool:
    """Whether the reference writes `value` as the digits of `int(value)`: an integer-valued
    float of magnitude at most 2^53 - 1 (NaN and infinities are not integer-valued)."""
    return value.is_integer() and -_INT_MAX <= value <= _INT_MAX


def _as_ints(value: Any) -> Any:
    """A copy of a value `_plain` answered `AS_INTS` for, its integer-valued floats made ints."""
    kind = type(value)
    if kind is dict:
        return {key: _as_ints(item) for key, item in value.items()}
    if kind is list:
        return [_as_ints(item) for item in value]
    if kind is float and value.is_integer():
        return int(value)
    return value


def _fixed_float(value: float) -> bool:
    """Whether the reference writes `repr(value)` unchanged: finite, not integer-valued, and
    without an exponent (the reference re-formats exponents and drops a trailing ".0")."""
    return math.isfinite(value) and not value.is_integer() and "e" not in repr(value)


def dumps(value: Any) -> bytes:
    """The RFC 8785 canonical bytes of `value` (byte-identical to `rfc8785.dumps`).

    Raises `rfc8785.CanonicalizationError` for what JCS cannot encode (NaN, infinities, ints
    beyond 2^53 - 1, lone surrogates, non-str keys)."""
    try:
        plain = _plain(value)
    except RecursionError:
        plain = NO  # the reference decides (and raises) for values nested this deep
    if plain != NO:
        try:
            if plain == AS_INTS:
                value = _as_ints(value)
            return _ENCODER.encode(value).encode("utf-8")
        except (UnicodeEncodeError, RecursionError):
            pass  # a lone surrogate: the reference raises its own error
    return rfc8785.dumps(value)
