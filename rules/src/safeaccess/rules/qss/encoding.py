"""The bytes of an AuditState's fields: a versioned binary layout (no pickle), validated on load.

This module never sees an `AuditState`, only its fields (`StateFields`), so that `state.py`
(`to_bytes`/`from_bytes`) and `codec.py` (`encode_state`/`decode_state`) both build on it
without importing each other.

Layout (little-endian): magic b"SAQSS\\0", u16 version, u16 flags (bit 0: constraints
tracked; bit 1, version 3 on: atom_of left out, because the bytes are a delta whose reader
rebuilds it from the parent state, `delta.py`; bits 2-3, version 4 on: atom_of's width, 0 for
int32, 1 for int8, 2 for int16), u64 n_records, n_atoms, outside + 1, n_query_sets, n_rows,
nnz, n_lanes, then per lane u64 p and r; then atom_of[n_records] in the narrowest signed type
that holds ids below n_atoms (`atom_type`), and when tracked: indptr int64[n_rows + 1], indices
int32[nnz], origin int32[n_rows] (version 2 on; the admission each row came with), when flag
bit 4 (weighted rows, issue 41) is set the entries' weights float64[nnz], per lane
d uint32[n_atoms], basis int32[r], K uint32[r*r], K⁻¹ uint32[r*r]; last a SHA-256 of
everything before it. Atom sizes are recomputed from atom_of on load.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from safeaccess.rules.qss import modp
from safeaccess.rules.qss.constraints import Constraints, Lane

MAGIC = b"SAQSS\0"
VERSION = 4
#: Versions this decoder reads (1: rows carry no origin; 2: no flag for a left-out atom_of;
#: 3: atom_of always int32).
READABLE = (1, 2, 3, 4)
#: Flag bits: constraints tracked; atom_of left out (supplied by the reader).
TRACKED = 1
NO_ATOMS = 2
#: Flag bit 4 (version 4): the rows carry weights (float64 per entry).
WEIGHTED = 16
#: Flag bits 2-3 (version 4 on): the code of atom_of's stored type.
_WIDTH_SHIFT = 2
_WIDTH_MASK = 3 << _WIDTH_SHIFT
_ATOM_TYPES = {0: "<i4", 1: "i1", 2: "<i2"}
_HEAD = struct.Struct("<6sHH7Q")
_LANE = struct.Struct("<2Q")
_DIGEST = 32


class StateFormatError(ValueError):
    """Bytes that are not a valid encoded AuditState."""


Int32Array = npt.NDArray[np.int32]
Int64Array = npt.NDArray[np.int64]


class StateFields(NamedTuple):
    """An AuditState's constructor arguments, in order (see `state.AuditState`)."""

    atom_of: Int32Array
    sizes: Int64Array
    outside: int
    n_query_sets: int
    constraints: Constraints | None


def encode_fields(state: StateFields) -> bytes:
    """The state's bytes: header, atoms, constraints when tracked, then a SHA-256 of it all."""
    return b"".join(encode_parts(state))


def encode_parts(state: StateFields, *, atoms: bool = True) -> list[bytes | memoryview]:
    """The state's bytes as a list of buffers, the last one the SHA-256 of the others: a writer
    hashes and writes them in turn, never joining a copy of the per-record array (40 MB at
    10 M records). `atoms=False` leaves atom_of out (flag bit 1): a delta's reader supplies it."""
    constraints = state.constraints
    tracked = constraints is not None
    lanes = constraints.lanes if constraints is not None else ()
    n_records = int(state.atom_of.shape[0])
    n_atoms = int(state.sizes.shape[0])
    width = _atom_code(n_atoms) if atoms else 0
    parts: list[bytes | memoryview] = [
        _HEAD.pack(
            MAGIC,
            VERSION,
            (TRACKED if tracked else 0)
            | (0 if atoms else NO_ATOMS)
            | width << _WIDTH_SHIFT
            | (WEIGHTED if constraints is not None and constraints.weighted else 0),
            n_records,
            n_atoms,
            state.outside + 1,
            state.n_query_sets,
            constraints.n_rows if constraints is not None else 0,
            constraints.nnz if constraints is not None else 0,
            len(lanes),
        )
    ]
    parts += [_LANE.pack(lane.p, int(lane.basis.shape[0])) for lane in lanes]
    if atoms:
        parts.append(_buffer(state.atom_of, _ATOM_TYPES[width]))
    if constraints is not None:
        parts.append(_buffer(constraints.indptr, "<i8"))
        parts.append(_buffer(constraints.indices, "<i4"))
        parts.append(_buffer(constraints.origin, "<i4"))
        if constraints.data is not None:
            parts.append(_buffer(constraints.data, "<f8"))
        for lane in lanes:
            parts.append(_buffer(lane.d, "<u4"))
            parts.append(_buffer(lane.basis, "<i4"))
            parts.append(_buffer(lane.k_mat, "<u4"))
            parts.append(_buffer(lane.k_inv, "<u4"))
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    parts.append(digest.digest())
    return parts


def atom_type(n_atoms: int) -> np.dtype[np.signedinteger[Any]]:
    """The stored type of atom ids below `n_atoms` (its `itemsize` is the bytes a record):
    int8 up to 128 atoms, int16 up to 32 768, else int32. A full state is mostly this array (4 bytes a record in int32: 40 MB at 10 M
    records): a state of up to 128 atoms (a scope's first few tables) writes, hashes and reads
    a quarter of it, one of up to 32 768 half. In memory the ids are int32 whatever the width
    on disk."""
    return np.dtype(_ATOM_TYPES[_atom_code(n_atoms)])


def _atom_code(n_atoms: int) -> int:
    if n_atoms <= 1 << 7:
        return 1
    if n_atoms <= 1 << 15:
        return 2
    return 0


def _buffer(array: npt.NDArray[np.generic], dtype: str) -> memoryview:
    """The array's bytes in `dtype` (no copy when it already is that type)."""
    return raw_bytes(np.ascontiguousarray(array, dtype=dtype))


def raw_bytes(array: npt.NDArray[np.generic]) -> memoryview:
    """A contiguous array's bytes as a flat byte view (empty arrays too), without a copy."""
    if array.size == 0:
        return memoryview(b"")
    return array.reshape(-1).data.cast("B")


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def take(self, dtype: str, count: int, what: str) -> npt.NDArray[np.generic]:
        width = np.dtype(dtype).itemsize * count
        if self.pos + width > len(self.data):
            raise StateFormatError(f"state is truncated in {what}")
        out = np.frombuffer(self.data[self.pos : self.pos + width], dtype=dtype).copy()
        self.pos += width
        return out

    def view(self, dtype: str, count: int, what: str) -> npt.NDArray[np.generic]:
        """Like `take`, without the copy: a read-only view of the (immutable) bytes (a copy
        only when the view would not be aligned to its item size)."""
        width = np.dtype(dtype).itemsize * count
        if self.pos + width > len(self.data):
            raise StateFormatError(f"state is truncated in {what}")
        out = np.frombuffer(self.data[self.pos : self.pos + width], dtype=dtype)
        if not out.flags.aligned:  # after a header of any length: numpy's fast paths want it
            out = out.copy()
        out.setflags(write=False)
        self.pos += width
        return out


def decode_fields(
    data: bytes | memoryview, atom_of: Int32Array | None = None, *, verified: bool = False
) -> StateFields:
    """The fields encoded in `data`, every count, range and the checksum checked; raise
    StateFormatError on anything else. Bytes that leave atom_of out (a delta's) need it as
    `atom_of` (rebuilt by the reader); bytes that hold it must not be given one.

    `verified`: the caller has checked these very bytes against a digest that covers them all
    (a state file's content address), so the state's own SHA-256 is not computed again (a
    second pass over 40 MB at 10 M records). Immutable `bytes` (or a view of them) are read
    without copying: the atom array is then a read-only view of `data`, which it keeps alive."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise StateFormatError(f"expected bytes, got {type(data).__name__}")
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    if not isinstance(view.obj, bytes):
        view = memoryview(bytes(view))  # a mutable buffer could change under the views
    if len(view) < _HEAD.size + _DIGEST or bytes(view[: len(MAGIC)]) != MAGIC:
        raise StateFormatError("not an encoded query-set auditor state (bad magic or too short)")
    body, digest = view[:-_DIGEST], bytes(view[-_DIGEST:])
    (_, version, flags, n_records, n_atoms, outside1, n_query_sets, n_rows, nnz, n_lanes) = (
        _HEAD.unpack_from(body)
    )
    if version not in READABLE:
        raise StateFormatError(f"state format version {version}; this auditor reads {READABLE}")
    if not verified and hashlib.sha256(body).digest() != digest:
        raise StateFormatError("state checksum mismatch: the bytes are corrupted or truncated")
    width = (flags & _WIDTH_MASK) >> _WIDTH_SHIFT
    if (
        flags & ~(TRACKED | NO_ATOMS | _WIDTH_MASK | WEIGHTED)
        or (flags & WEIGHTED and (version < 4 or not flags & TRACKED))
        or (flags & NO_ATOMS and version < 3)
        or (width and (version < 4 or flags & NO_ATOMS))
        or width not in _ATOM_TYPES
    ):
        raise StateFormatError(f"unknown state flags {flags}")
    if bool(flags & NO_ATOMS) != (atom_of is not None):
        raise StateFormatError(
            "the state leaves its atoms to a parent state, and none was given"
            if atom_of is None
            else "the state holds its own atoms; a parent's were given"
        )
    reader = _Reader(memoryview(body))
    reader.pos = _HEAD.size
    lane_heads = []
    for _ in range(n_lanes):
        if reader.pos + _LANE.size > len(body):
            raise StateFormatError("state is truncated in the lane headers")
        lane_heads.append(_LANE.unpack_from(body, reader.pos))
        reader.pos += _LANE.size
    if atom_of is None:
        stored = reader.view(_ATOM_TYPES[width], n_records, "atom_of")
        # int32 in memory: a narrower stored array is widened, read-only as a view is (an
        # admission that splits atoms copies them)
        atom_of = stored.astype(np.int32, copy=False)
        atom_of.setflags(write=False)
    elif atom_of.dtype != np.int32 or atom_of.shape != (n_records,):
        raise StateFormatError(
            f"the rebuilt atoms cover {atom_of.shape} record ids as {atom_of.dtype}, the state "
            f"{n_records} as int32"
        )
    if n_records and (int(atom_of.min()) < 0 or int(atom_of.max()) >= n_atoms):
        raise StateFormatError("atom ids out of range")
    sizes = np.bincount(atom_of, minlength=n_atoms).astype(np.int64)
    if sizes.shape[0] != n_atoms or (n_atoms and int(sizes.min()) == 0):
        raise StateFormatError("every atom must hold at least one record")
    outside = int(outside1) - 1
    if outside >= n_atoms or outside < -1:
        raise StateFormatError("outside atom out of range")
    constraints: Constraints | None = None
    if flags & TRACKED:
        constraints = _decode_constraints(
            reader, lane_heads, n_atoms, n_rows, nnz, version, bool(flags & WEIGHTED)
        )
    elif n_lanes or n_rows or nnz:
        raise StateFormatError("constraint data present in a state marked untracked")
    if reader.pos != len(body):
        raise StateFormatError(f"{len(body) - reader.pos} trailing bytes in state")
    return StateFields(atom_of, sizes, outside, int(n_query_sets), constraints)


def _decode_constraints(
    reader: _Reader,
    lane_heads: list[tuple[int, int]],
    n_atoms: int,
    n_rows: int,
    nnz: int,
    version: int,
    weighted: bool = False,
) -> Constraints:
    indptr = reader.take("<i8", n_rows + 1, "row pointers").astype(np.int64, copy=False)
    indices = reader.take("<i4", nnz, "row entries").astype(np.int32, copy=False)
    if version >= 2:
        origin = reader.take("<i4", n_rows, "row origins").astype(np.int32, copy=False)
    else:
        origin = np.full(n_rows, -1, dtype=np.int32)
    data = None
    if weighted:
        data = reader.take("<f8", nnz, "row weights").astype(np.float64, copy=False)
        if not bool(np.all(np.isfinite(data))) or bool(np.any(data == 0)):
            raise StateFormatError("row weights must be finite and nonzero")
    if indptr[0] != 0 or indptr[-1] != nnz or np.any(np.diff(indptr) <= 0):
        raise StateFormatError("row pointers are not increasing from 0 to the entry count")
    if nnz and (int(indices.min()) < 0 or int(indices.max()) >= n_atoms):
        raise StateFormatError("row entries name atoms out of range")
    lanes = []
    check_rng = np.random.default_rng()
    for p, r in lane_heads:
        if not (1 << 30) <= p < (1 << 31) or not modp.is_prime(p):
            raise StateFormatError(f"lane modulus {p} is not a prime in [2**30, 2**31)")
        d = reader.take("<u4", n_atoms, "atom weights").astype(np.int64, copy=False)
        basis = reader.take("<i4", r, "basis").astype(np.int64, copy=False)
        k_mat = reader.take("<u4", r * r, "K").astype(np.int64, copy=False).reshape(r, r)
        k_inv = reader.take("<u4", r * r, "K inverse").astype(np.int64, copy=False).reshape(r, r)
        if n_atoms and int(d.max()) >= p:
            raise StateFormatError("atom weights out of range")
        if r and (int(basis.min()) < 0 or int(basis.max()) >= n_rows):
            raise StateFormatError("basis names rows out of range")
        if np.unique(basis).size != r:
            raise StateFormatError("basis names a row twice")
        if r and (int(k_mat.max()) >= p or int(k_inv.max()) >= p):
            raise StateFormatError("K entries out of range")
        if r:
            x = check_rng.integers(0, p, size=(r, 1), dtype=np.int64)
            if not np.array_equal(modp.matmul(k_mat, modp.matmul(k_inv, x, p), p), x):
                raise StateFormatError("stored K inverse does not invert K")
        lanes.append(Lane(p=int(p), d=d, basis=basis, k_mat=k_mat, k_inv=k_inv))
    return Constraints(
        n_atoms=n_atoms,
        indptr=indptr,
        indices=indices,
        lanes=tuple(lanes),
        origin=origin,
        data=data,
    )
