"""A state as the steps that led to it from a parent state: what a scope writes per admission.

A full encoded state holds one atom id per record id (40 MB at 10 M records in int32), and
hashing, writing and syncing it on every admitted step cost more than the admission itself. Every
admission changes the atoms only by refining them with its query-set arrays (and a new dataset
version grows them), and the refinement is a deterministic function of the parent's atoms and
the array (`partition.refine`). So a delta holds the steps (each array in its compact cell
type, 10 MB at 10 M records for a table of up to 127 cells) and everything else of the new
state (sizes aside, the constraints are small: R rows over the atoms); its reader replays the
steps on the parent's atoms and checks the result against the stored atom count, the outside
atom and a SHA-256 of the atom sizes.

What a delta's steps cost depends on the number of records and the arrays' cell types, both
fixed by the dataset version's published row count and the output's released cells: never on
which records the arrays select. A writer may leave out an array that split no atom (the ids are
then unchanged, so there is nothing to replay: the server does, `ScopeState.refined`); whether
one split depends on the records, so that saving is data-dependent time, like the auditor's
other paths.

Layout (little-endian): magic b"SAQSD\\0", u16 version, u32 step count, then per step u8 kind
(0: grow, 1: refine), u8 item size (grow: 0; refine: 1, 2 or 4, signed), u64 n (grow: the new
record count; refine: the array's length), the array's bytes; then the SHA-256 of the new
state's atom sizes (int64), then the new state encoded without its atoms (`encoding.py`, flag
bit 1). The whole delta is covered by the scope file's SHA-256 (its content address) and the
state part by its own checksum.

The replay must give the atom ids the admission gave: `refine`'s id assignment is part of this
format. Changing it needs a new delta version (the sizes' digest catches a change that permutes
ids of different sizes, and the stored atom count one that adds or drops atoms).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from safeaccess.rules.qss.encoding import (
    Int32Array,
    Int64Array,
    StateFormatError,
    decode_fields,
    encode_parts,
    raw_bytes,
)
from safeaccess.rules.qss.partition import CellArray, refine
from safeaccess.rules.qss.state import AuditState

MAGIC = b"SAQSD\0"
VERSION = 1
_HEAD = struct.Struct("<6sHI")
_STEP = struct.Struct("<BBQ")
_DIGEST = 32
_GROW, _REFINE = 0, 1
#: The start of an encoded state's header, up to its outside atom (+1): see `encoding._HEAD`.
_STATE_OUTSIDE = struct.Struct("<6sHH3Q")
_CELL_TYPES: dict[int, np.dtype[Any]] = {1: np.dtype("i1"), 2: np.dtype("<i2"), 4: np.dtype("<i4")}


@dataclass(frozen=True)
class Grow:
    """The state grew to `n_records` record ids (a new dataset version's ids)."""

    n_records: int


@dataclass(frozen=True)
class Refine:
    """The atoms were refined by one admitted query-set array (over record ids)."""

    cells: CellArray


Step = Grow | Refine


def sizes_digest(sizes: Int64Array) -> bytes:
    """The SHA-256 of atom sizes as little-endian int64 (a fingerprint of the atoms' ids)."""
    return hashlib.sha256(raw_bytes(np.ascontiguousarray(sizes, dtype="<i8"))).digest()


def encode_delta(state: AuditState, steps: Sequence[Step]) -> list[bytes | memoryview]:
    """The delta that turns the parent state into `state` by `steps`, as a list of buffers (a
    writer hashes and writes them in turn; `b"".join` gives the bytes)."""
    parts: list[bytes | memoryview] = [_HEAD.pack(MAGIC, VERSION, len(steps))]
    for step in steps:
        if isinstance(step, Grow):
            parts.append(_STEP.pack(_GROW, 0, step.n_records))
            continue
        cells = step.cells
        item = cells.dtype.itemsize
        if cells.ndim != 1 or item not in _CELL_TYPES or cells.dtype.kind != "i":
            raise ValueError(
                f"a refining array must be 1-D int8, int16 or int32, got {cells.dtype}"
            )
        wire = np.ascontiguousarray(cells, dtype=_CELL_TYPES[item])
        parts.append(_STEP.pack(_REFINE, item, wire.shape[0]))
        parts.append(raw_bytes(wire))
    parts.append(sizes_digest(state.sizes))
    parts += encode_parts(state.fields(), atoms=False)
    return parts


def apply_delta(parent: AuditState, data: bytes | memoryview) -> AuditState:
    """The state `data` (a delta) makes of `parent`; raise StateFormatError when the bytes are
    not a valid delta or the replay does not give the state it describes."""
    return apply_deltas(parent, [data])


def apply_deltas(parent: AuditState, deltas: Sequence[bytes | memoryview]) -> AuditState:
    """The state a chain of deltas makes of `parent`, the first applying to `parent` and each
    next to the state before. The steps of every delta are replayed on one atom array, and
    each delta's replayed atoms are checked against its sizes' digest and outside atom; only
    the last delta's state is decoded (the others' constraints are never needed)."""
    if not deltas:
        raise ValueError("a chain of deltas needs at least one")
    atom_of: Int32Array = parent.atom_of
    sizes, outside = parent.sizes, parent.outside
    owned = False  # the parent's atom array is read-only: never written in place
    rest = memoryview(b"")
    for data in deltas:
        view = memoryview(data)
        atom_of, sizes, outside, owned, pos = _replay(view, atom_of, sizes, outside, owned)
        if pos + _DIGEST > len(view):
            raise StateFormatError("state delta is truncated before its atom sizes")
        expected = bytes(view[pos : pos + _DIGEST])
        rest = view[pos + _DIGEST :]
        if sizes_digest(sizes) != expected or _outside_of(rest) != outside:
            raise StateFormatError("replaying the state delta does not give the atoms it describes")
    if not owned:
        atom_of = atom_of.copy()
    fields = decode_fields(bytes(rest), atom_of=atom_of)
    if fields.outside != outside or not np.array_equal(fields.sizes, sizes):
        raise StateFormatError("replaying the state delta does not give the atoms it describes")
    return AuditState(*fields)


def _outside_of(state_part: memoryview) -> int:
    """The outside atom a state's header names (`encoding`'s layout: after the magic, version,
    flags, n_records and n_atoms), or -2 when the header is cut short."""
    if len(state_part) < _STATE_OUTSIDE.size:
        return -2
    return int(_STATE_OUTSIDE.unpack_from(state_part)[-1]) - 1


def _replay(
    view: memoryview, atom_of: Int32Array, sizes: Int64Array, outside: int, owned: bool
) -> tuple[Int32Array, Int64Array, int, bool, int]:
    """Replay one delta's steps: the atoms after them, whether the atom array is now this
    replay's own, and the position after the steps."""
    if len(view) < _HEAD.size or bytes(view[: len(MAGIC)]) != MAGIC:
        raise StateFormatError("not an encoded query-set state delta (bad magic or too short)")
    _, version, count = _HEAD.unpack_from(view)
    if version != VERSION:
        raise StateFormatError(f"state delta version {version}; this auditor reads {VERSION}")
    pos = _HEAD.size
    for _ in range(count):
        if pos + _STEP.size > len(view):
            raise StateFormatError("state delta is truncated in its steps")
        kind, item, n = _STEP.unpack_from(view, pos)
        pos += _STEP.size
        if kind == _GROW:
            if item != 0 or n < atom_of.shape[0]:
                raise StateFormatError("a state delta's grow step is invalid")
            atom_of, sizes, outside = _grow(atom_of, sizes, outside, n)
            owned = True
            continue
        dtype = _CELL_TYPES.get(item)
        if kind != _REFINE or dtype is None or n != atom_of.shape[0]:
            raise StateFormatError("a state delta's refining step is invalid")
        width = item * n
        if pos + width > len(view):
            raise StateFormatError("state delta is truncated in an array")
        cells = np.frombuffer(view[pos : pos + width], dtype=dtype)
        pos += width
        if n and int(cells.min()) < -1:
            raise StateFormatError("a state delta's array has cell indices below -1")
        ref = refine(atom_of, sizes, outside, cells)
        atom_of, owned = ref.applied(atom_of, owned=owned)
        sizes, outside = ref.sizes, ref.outside
    return atom_of, sizes, outside, owned, pos


def _grow(
    atom_of: Int32Array, sizes: Int64Array, outside: int, n_records: int
) -> tuple[Int32Array, Int64Array, int]:
    """`AuditState.grow`'s atoms: the new record ids join the outside atom (a new one when
    there is none)."""
    added = n_records - int(atom_of.shape[0])
    if added == 0:
        return atom_of, sizes, outside
    sizes = sizes.copy()
    if outside < 0:
        outside = int(sizes.shape[0])
        sizes = np.concatenate([sizes, np.zeros(1, dtype=np.int64)])
    sizes[outside] += added
    grown = np.concatenate([atom_of, np.full(added, outside, dtype=np.int32)])
    return grown, sizes, outside
