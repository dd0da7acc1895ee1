"""The canonical-JSON fast path is byte-identical to the RFC 8785 library, or defers to it."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safeaccess.client.protocol import canonical

# Characters where JSON encoders and the two key orders are known to part ways: controls (short
# and \u escapes), quote and backslash, DEL, the line/paragraph separators, the private-use and
# specials area just below U+FFFF, characters beyond the BMP and lone surrogates.
TRICKY = (
    [chr(c) for c in range(0x20)]
    + ['"', "\\", "/", "\x7f", "\u2028", "\u2029", "\ue000", "\uf8ff", "\ufeff", "\ufffd"]
    + ["\uffff", "\U00010000", "\U0001f600", "\U0010ffff", "é", "ß", "\ud800", "\udfff"]
)
tricky_text = st.text(alphabet=st.one_of(st.sampled_from(TRICKY), st.characters()), max_size=12)
texts = st.one_of(tricky_text, st.text(max_size=20))
BOUND = 2**53
ints = st.one_of(
    st.integers(min_value=-(BOUND - 1), max_value=BOUND - 1),
    st.sampled_from([BOUND - 1, -(BOUND - 1), BOUND, -BOUND, 2**64, 0, -1]),
    st.integers(),
)
floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = st.one_of(st.none(), st.booleans(), ints, texts, floats)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(texts, children, max_size=6),
        st.tuples(children, children),
    ),
    max_leaves=40,
)
# Floats around the fast path's edges: 1e-4 and 1e16 (where repr starts writing an exponent),
# integer values, zero and negative zero, the smallest and largest doubles.
EDGE_FLOATS = [1e-4, 9.999999999999999e-05, 1e16, 9999999999999998.0, 1e15 + 0.5, 0.1, 0.5]
EDGE_FLOATS += [-x for x in EDGE_FLOATS] + [0.0, -0.0, 2.0, 5e-324, 1.7976931348623157e308]
edge_floats = st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(min_value=1e-5, max_value=1e17))
# Mostly the types the fast path takes, so most examples exercise it.
plain_values = st.recursive(
    st.one_of(st.none(), st.booleans(), ints, texts, edge_floats, floats),
    lambda children: st.one_of(
        st.lists(children, max_size=6), st.dictionaries(texts, children, max_size=6)
    ),
    max_leaves=40,
)


# What the library raises for what it refuses (its own error; a UnicodeEncodeError from its key
# sort for a lone surrogate in a key): the fast path must raise the same.
REFUSED = (rfc8785.CanonicalizationError, UnicodeEncodeError)


def _reference(value: Any) -> bytes | type[BaseException]:
    try:
        return rfc8785.dumps(value)
    except REFUSED as exc:
        return type(exc)


def _fast(value: Any) -> bytes | type[BaseException]:
    try:
        return canonical.dumps(value)
    except REFUSED as exc:
        return type(exc)


@settings(max_examples=4000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain_values)
def test_equal_to_the_library_on_plain_values(value: Any) -> None:
    assert _fast(value) == _reference(value)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_equal_to_the_library_on_any_value(value: Any) -> None:
    assert _fast(value) == _reference(value)


@settings(max_examples=2000, deadline=None)
@given(st.dictionaries(tricky_text, st.integers(-5, 5), min_size=2, max_size=8))
def test_keys_are_ordered_like_the_library(obj: dict[str, int]) -> None:
    assert _fast(obj) == _reference(obj)


def test_utf16_key_order_where_code_point_order_differs() -> None:
    # U+E000 sorts before U+10000 by code point but after it in UTF-16 (D800 DC00).
    obj = {"\ue000": 1, "\U00010000": 2}
    assert canonical.dumps(obj) == rfc8785.dumps(obj)
    assert canonical.dumps(obj).index("\U00010000".encode()) < canonical.dumps(obj).index(
        "\ue000".encode()
    )


@pytest.mark.parametrize(
    "bad", [float("nan"), float("inf"), 2**53, -(2**53), "\ud800", {1: "x"}, {"k": [1.0, 2**60]}]
)
def test_what_rfc8785_refuses_is_refused(bad: Any) -> None:
    with pytest.raises(rfc8785.CanonicalizationError):
        canonical.dumps(bad)


def test_floats_and_subclasses_take_the_reference_path() -> None:
    class Text(str):
        pass

    for value in [{"x": 1.0}, {"x": 1e21}, {"x": 5e-7}, [Text("a")], ("a", 1), {"x": True}]:
        assert canonical.dumps(value) == rfc8785.dumps(value)


def test_fixed_notation_floats_take_the_fast_path() -> None:
    # issue 25: a float written without exponent and not integer-valued is encoded by the C
    # encoder (equal to the library: the property tests above); the rest go to the library.
    for value in [0.5, -0.1, 123.456, 1e-4, 0.30000000000000004, 1234567890123.5]:
        assert canonical._plain({"x": [value]}), value
    for value in [1e-5, 1e16, 2.0**53, 1e21, float("nan"), float("inf")]:
        assert not canonical._plain({"x": [value]}), value


def test_integer_valued_floats_take_the_fast_path_as_ints() -> None:
    # issue 25: an output's counts (12.0) are written as the integer's digits by the library;
    # below 2^53 the fast path encodes them from a copy with ints, byte for byte the same.
    edge = [2.0, 0.0, -0.0, -7.0, 12.0, 2.0**53 - 1, -(2.0**53 - 1), 1e15]
    for value in edge:
        assert canonical._plain({"x": [value]}) == canonical.AS_INTS, value
        assert canonical.dumps({"x": [value], "y": 0.5}) == rfc8785.dumps({"x": [value], "y": 0.5})
    table = {"cells": [[1.0, 2.5], [3.0, None]], "n": 6.0, "label": "x", "exact": 4}
    assert canonical.dumps(table) == rfc8785.dumps(table)
    assert table["n"] == 6.0 and type(table["n"]) is float  # the caller's value is not changed
