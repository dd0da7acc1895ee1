"""AuditState: empty, grow, immutability, and the binary encoding."""

from __future__ import annotations

import numpy as np
import pytest

from safeaccess.rules.qss import (
    AuditMode,
    AuditPolicy,
    AuditState,
    QuerySetError,
    StateFormatError,
    admit,
    codec,
)


def _cells(n: int, groups: dict[int, range | list[int]]) -> np.ndarray:
    a = np.full(n, -1, dtype=np.int32)
    for c, members in groups.items():
        a[list(members)] = c
    return a


def _built(mode: AuditMode) -> AuditState:
    state = AuditState.empty(60)
    policy = AuditPolicy(mode=mode, k=5)
    for arrays in (
        [_cells(60, {0: range(0, 30), 1: range(30, 60)})],
        [_cells(60, {0: range(0, 20), 1: range(20, 40)})],
    ):
        result = admit(state, arrays, policy)
        assert result.admitted, result.reason
        assert result.state is not None
        state = result.state
    return state


def test_empty_state_is_one_atom_outside_everything() -> None:
    state = AuditState.empty(7)
    assert (state.n_records, state.n_atoms, state.n_constraints) == (7, 1, 0)
    assert state.outside == 0
    assert AuditState.empty(0).n_atoms == 0


def test_admit_never_mutates_the_state_it_is_given() -> None:
    state = _built(AuditMode.SPAN)
    before = state.to_bytes()
    atom_of = state.atom_of.copy()
    refused = admit(state, [_cells(60, {0: range(0, 21)})], AuditPolicy(k=5))
    admitted = admit(state, [_cells(60, {0: range(0, 40)})], AuditPolicy(k=5))
    assert not refused.admitted and refused.state is None
    assert admitted.admitted and admitted.state is not None
    assert np.array_equal(state.atom_of, atom_of)
    assert state.to_bytes() == before
    with pytest.raises(ValueError):
        state.atom_of[0] = 3


@pytest.mark.parametrize("mode", list(AuditMode))
def test_round_trip_through_bytes_keeps_every_decision(mode: AuditMode) -> None:
    state = _built(mode)
    again = AuditState.from_bytes(state.to_bytes())
    assert np.array_equal(again.atom_of, state.atom_of)
    assert np.array_equal(again.sizes, state.sizes)
    assert (again.n_constraints, again.n_query_sets, again.outside) == (
        state.n_constraints,
        state.n_query_sets,
        state.outside,
    )
    policy = AuditPolicy(mode=mode, k=5)
    for probe in ([_cells(60, {0: range(0, 21)})], [_cells(60, {0: range(0, 40)})]):
        assert admit(again, probe, policy).admitted == admit(state, probe, policy).admitted


@pytest.mark.parametrize("mode", list(AuditMode))
def test_codec_functions_and_state_methods_are_one_encoding(mode: AuditMode) -> None:
    """The codec's names (kept for callers after the state <-> codec cycle was broken) write and
    read the same bytes as the state's own methods, bad bytes included."""
    state = _built(mode)
    data = codec.encode_state(state)
    assert data == state.to_bytes()
    assert data.startswith(codec.MAGIC)
    again = codec.decode_state(data)
    assert isinstance(again, AuditState)
    assert again.to_bytes() == data
    assert codec.StateFormatError is StateFormatError
    with pytest.raises(StateFormatError, match="checksum"):
        codec.decode_state(data[:-1] + bytes([data[-1] ^ 1]))


def test_state_bytes_are_compact() -> None:
    state = AuditState.empty(100_000)
    assert len(state.to_bytes()) < 100_000 * 4 + 1_000


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:10], "too short"),
        (lambda b: b"XXXXXX" + b[6:], "magic"),
        (lambda b: b[:6] + b"\x09\x00" + b[8:], "version"),
        (lambda b: b[:-40] + bytes([b[-40] ^ 1]) + b[-39:], "checksum"),
    ],
)
def test_bad_bytes_are_rejected_with_a_clear_error(mutate: object, message: str) -> None:
    data = _built(AuditMode.SPAN).to_bytes()
    with pytest.raises(StateFormatError, match=message):
        AuditState.from_bytes(mutate(data))  # type: ignore[operator]


def test_grow_puts_new_records_outside_everything() -> None:
    state = _built(AuditMode.SPAN)
    outside_before = state.outside
    grown = state.grow(64)
    assert grown.n_records == 64 and state.n_records == 60
    assert outside_before == -1  # every record was inside the first table
    assert set(grown.atom_of[60:].tolist()) == {grown.outside}
    assert grown.sizes[grown.outside] == 4
    assert grown.grow(64) is grown
    with pytest.raises(ValueError, match="cannot shrink"):
        grown.grow(10)


def test_malformed_query_sets_raise_and_name_the_fix() -> None:
    state = AuditState.empty(10)
    policy = AuditPolicy(k=3)
    with pytest.raises(QuerySetError, match="length 10"):
        admit(state, [np.zeros(9, dtype=np.int32)], policy)
    with pytest.raises(QuerySetError, match="integer"):
        admit(state, [np.zeros(10, dtype=np.float64)], policy)
    with pytest.raises(QuerySetError, match="-1"):
        admit(state, [np.full(10, -2, dtype=np.int32)], policy)


def test_policy_is_frozen_and_strict() -> None:
    with pytest.raises(ValueError):
        AuditPolicy(k=1)
    with pytest.raises(ValueError):
        AuditPolicy(k=5, colour="red")  # type: ignore[call-arg]
    policy = AuditPolicy(k=5)
    assert (
        policy.mode is AuditMode.SPAN
        and policy.atom_cap == 2_000_000
        and policy.search_nodes == 400
    )
    with pytest.raises(ValueError):
        policy.k = 3  # type: ignore[misc]


def test_decoding_bytes_checked_by_the_caller_skips_the_checksum_and_copies_no_atoms() -> None:
    from safeaccess.rules.qss.encoding import StateFields, atom_type, decode_fields, encode_fields

    rng = np.random.default_rng(4)
    state = AuditState.empty(4_000)
    admission = admit(state, [rng.integers(0, 3, 4_000).astype(np.int8)], AuditPolicy(k=2))
    assert admission.state is not None
    raw = admission.state.to_bytes()
    # the checksum is the last 32 bytes: a wrong one is refused unless the caller verified
    wrong = raw[:-1] + bytes([raw[-1] ^ 1])
    with pytest.raises(StateFormatError, match="checksum"):
        decode_fields(wrong)
    fields = decode_fields(wrong, verified=True)
    assert np.array_equal(fields.atom_of, admission.state.atom_of)
    # few atoms: stored as int8 (a quarter of int32), decoded to a read-only int32 copy
    n_atoms = admission.state.sizes.shape[0]
    assert atom_type(n_atoms) == "i1" and len(raw) < 4_000 * 2
    atoms = decode_fields(raw, verified=True).atom_of
    assert atoms.dtype == np.int32 and not atoms.flags.writeable
    # more than 32 768 atoms: int32, a read-only view of the bytes wherever they sit aligned,
    # else a copy
    wide = np.random.default_rng(5).permutation(40_000).astype(np.int32)
    wide_raw = encode_fields(StateFields(wide, np.ones(40_000, dtype=np.int64), -1, 1, None))
    assert atom_type(40_000) == "<i4" and len(wide_raw) > 4 * 40_000
    views = 0
    for pad in range(4):
        atoms = decode_fields(memoryview(b"\0" * pad + wide_raw)[pad:], verified=True).atom_of
        assert atoms.flags.aligned and not atoms.flags.writeable
        assert np.array_equal(atoms, wide)
        views += not atoms.flags.owndata
    assert views == 1
    # a mutable buffer is copied first: changing it afterwards changes nothing decoded
    buffer = bytearray(raw)
    decoded = decode_fields(buffer)
    buffer[:] = bytes(len(buffer))
    assert np.array_equal(decoded.atom_of, admission.state.atom_of)


def test_an_admission_that_splits_nothing_shares_the_read_only_atoms() -> None:
    """A repeated query set leaves the atoms as they are: the new state holds the old state's
    read-only atom array (no copy), and a later admission that first repeats and then splits
    writes into a copy of its own, never into either state."""
    from safeaccess.rules.qss import AuditMode, AuditPolicy, admit

    policy = AuditPolicy(mode=AuditMode.SPAN, k=2)
    rng = np.random.default_rng(3)
    cells = rng.integers(0, 4, 400).astype(np.int8)
    first = admit(AuditState.empty(400), [cells], policy)
    assert first.state is not None
    before = first.state.atom_of.copy()
    again = admit(first.state, [cells], policy)
    assert again.state is not None and again.state.atom_of is first.state.atom_of
    finer = (cells * 2 + rng.integers(0, 2, 400)).astype(np.int8)
    both = admit(again.state, [cells, finer], policy)
    assert both.state is not None and both.state.n_atoms > first.state.n_atoms
    assert np.array_equal(first.state.atom_of, before)
    assert not np.shares_memory(both.state.atom_of, first.state.atom_of)
