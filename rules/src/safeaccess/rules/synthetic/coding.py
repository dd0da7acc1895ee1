"""Validation of level-coded arrays and packing of key tuples into single integers.

Every attack check works on integer-coded columns (level indices 0..L-1). Packing a key tuple into
one int64 turns "records that agree on these key positions" into an equality of masked integers,
which numpy can sort and join without Python loops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from safeaccess.rules.synthetic.errors import SyntheticCheckError

IntArray = NDArray[np.int64]

# Bits available for a packed key: 63 keeps every packed value a non-negative int64.
_MAX_BITS = 63


def coded_matrix(values: ArrayLike, levels: Sequence[int], name: str) -> IntArray:
    """`values` as an int64 matrix (records x columns) with column i in 0..levels[i]-1."""
    arr = np.asarray(values)
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2:
        raise SyntheticCheckError(
            f"{name} must be a 2-D array (records x columns), got {arr.ndim}-D"
        )
    if arr.shape[1] != len(levels):
        raise SyntheticCheckError(
            f"{name} has {arr.shape[1]} columns but {len(levels)} level counts were given"
        )
    if (
        arr.size
        and not np.issubdtype(arr.dtype, np.integer)
        and not (np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)))
    ):
        raise SyntheticCheckError(f"{name} must hold integer level indices")
    out = arr.astype(np.int64, copy=False)
    lv = np.asarray(levels_checked(levels), dtype=np.int64)
    if out.size:
        bad = (out < 0) | (out >= lv)
        if bad.any():
            row, col = (int(i) for i in np.argwhere(bad)[0])
            raise SyntheticCheckError(
                f"{name}[{row}, {col}] = {out[row, col]} is outside the levels 0..{lv[col] - 1}"
            )
    return out


def coded_vector(values: ArrayLike, levels: int, name: str) -> IntArray:
    """`values` as an int64 vector with entries in 0..levels-1."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise SyntheticCheckError(f"{name} must be a 1-D array, got {arr.ndim}-D")
    return coded_matrix(arr.reshape(-1, 1), [levels], name)[:, 0]


def levels_checked(levels: Sequence[int]) -> list[int]:
    """The level counts as ints, each >= 1."""
    out = []
    for i, lv in enumerate(levels):
        if isinstance(lv, bool) or int(lv) != lv or int(lv) < 1:
            raise SyntheticCheckError(f"level count {i} must be an integer >= 1, got {lv!r}")
        out.append(int(lv))
    return out


def field_bits(levels: Sequence[int]) -> list[int]:
    """Bits of each column's field in a packed key: ceil(log2 L), at least 1."""
    return [max(1, int(lv - 1).bit_length()) for lv in levels]


def fits_packed(levels: Sequence[int]) -> bool:
    """Whether the key tuple fits one non-negative int64 with a bit field per column."""
    return sum(field_bits(levels)) <= _MAX_BITS


def pack(keys: IntArray, levels: Sequence[int]) -> tuple[IntArray, list[int]]:
    """Pack each row into one int64 (column 0 in the lowest bits); also return each column's mask.

    With fields of whole bits, "agree on the columns outside M" is `a & keep == b & keep` where
    `keep` clears the masks of M; that is what makes the shell search a sort-join.
    """
    bits = field_bits(levels)
    packed = np.zeros(keys.shape[0], dtype=np.int64)
    masks = []
    shift = 0
    for col, b in enumerate(bits):
        packed |= keys[:, col] << shift
        masks.append(((1 << b) - 1) << shift)
        shift += b
    return packed, masks


def row_ids(*arrays: IntArray) -> list[IntArray]:
    """Common integer ids for the rows of several same-width integer matrices (equal rows, equal id)."""
    widths = {a.shape[1] for a in arrays}
    if len(widths) != 1:
        raise SyntheticCheckError(f"the arrays have different column counts: {sorted(widths)}")
    stacked = np.concatenate(arrays, axis=0)
    if stacked.shape[0] == 0:
        return [np.zeros(0, dtype=np.int64) for _ in arrays]
    dims = [int(m) + 1 for m in stacked.max(axis=0)] if stacked.shape[1] else []
    if stacked.shape[1] and stacked.min() >= 0 and math.prod(dims) < 2**62:
        # Mixed-radix codes in C order sort as the rows do, so the ids are the same as the
        # row-wise unique's, from a 1-D sort (np.unique over rows sorts a structured view,
        # several times slower at 10^5 rows).
        flat = np.ravel_multi_index(tuple(stacked.T), dims)
        _, inv = np.unique(flat, return_inverse=True)
    else:
        _, inv = np.unique(stacked, axis=0, return_inverse=True)
    inv = inv.reshape(-1).astype(np.int64)
    out = []
    start = 0
    for a in arrays:
        out.append(inv[start : start + a.shape[0]])
        start += a.shape[0]
    return out
