"""The inner loop of `modp.ColumnBasis.insert`, compiled: the columns of a batch taken in order,
each kept when it is independent of those kept before it, by exact elimination mod p in machine
code (numba).

Why compiled: the certificate's exact search inserts thousands of batches into bases of a few
dozen to a few hundred dimensions (issue 41: 6 400 inserts visiting half a million columns in
one admission), where numpy's per-call overhead, not arithmetic, was the cost (1.6 million
`np.flatnonzero` calls on vectors of 60 entries, one matrix product per block of 64 columns).

Exact: every value is an int64 in [0, p) with p < 2**31, so one product is below 2**62. A
column is reduced by adding (p − c)·v for each basis vector v, and the sum is reduced mod p
after at most `(2**63 − 1 − p) // (p − 1)**2` terms (one for p near 2**31, about two million
for the search's small primes below 2**21), so no sum ever exceeds 2**63 − 1 and nothing is
rounded or wraps.

Compiled once per machine and cached next to this file (or in the user's cache directory, or
NUMBA_CACHE_DIR), so a process pays the compilation (about a second) only the first time. Where
no cache directory is writable (a read-only deployment: `read_only` containers, systemd's
ProtectSystem=strict with ProtectHome) it is compiled in memory at import, by every process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numba
import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]

_INT64_MAX = 9_223_372_036_854_775_807


def _compile(func: Callable[..., int], signature: str) -> Callable[..., int]:
    """`func` compiled for `signature` now (at import, never inside an admission's CPU budget),
    cached on disk where a cache directory is writable, in memory where none is."""
    try:
        compiled = numba.njit(signature, cache=True, nogil=True)(func)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        compiled = numba.njit(signature, nogil=True)(func)
    return cast(Callable[..., int], compiled)


def _inverse_mod(x: int, p: int) -> int:
    """x**(p − 2) mod p (Fermat): the inverse of x ≠ 0 mod the prime p."""
    result = 1
    base = x % p
    e = p - 2
    while e > 0:
        if e & 1:
            result = result * base % p
        base = base * base % p
        e >>= 1
    return result


# compiled before `_independent_columns`, which calls it by this global name
_inverse = _compile(_inverse_mod, "int64(int64, int64)")


def _independent_columns(
    work: Int64Array,
    rows: Int64Array,
    room: int,
    p: int,
    basis: Int64Array,
    pivots: Int64Array,
    taken: Int64Array,
) -> int:
    """Read the columns of `work` (n, b; taken mod p) in order and keep each one that is
    independent of those kept before it, until `room` are kept; `rows` (increasing) are the
    rows where the columns may be nonzero (the others are zero: the pivot rows of the vectors
    they were reduced against). Returns how many were kept; on return `taken[:s]` are their
    positions in `work`, and `basis[:, :s]` (one vector a column) is a basis of their span with
    `basis[pivots[u], t]` = 1 if t = u, else 0 (fully reduced), each vector's pivot row the
    first nonzero row of the column's residual.

    The basis is kept fully reduced while reading, so a column's coefficients are its own
    entries on the pivot rows and only the rows that are no pivot yet need computing: a
    column met when s vectors are kept costs (free rows) × s multiply-adds, which is small
    exactly when s is large, where most columns of a batch are met (dependent ones). Those
    free rows alone of the earlier vectors are updated when a vector is added; the pivot rows'
    entries (the identity) are written at the end."""
    n, b = work.shape
    terms = (_INT64_MAX - p) // ((p - 1) * (p - 1))  # multiply-adds between reductions mod p
    free = rows.copy()  # the rows that are no pivot yet, increasing
    m = free.shape[0]
    coef = np.empty(room, np.int64)
    which = np.empty(room, np.int64)
    residual = np.empty(n, np.int64)
    s = 0
    for j in range(b):
        if s == room or m == 0:
            break
        # the column's coefficients: its entries on the pivot rows (p − c, to add)
        k = 0
        for t in range(s):
            c = work[pivots[t], j]
            if c < 0 or c >= p:  # (entries come reduced; a division only when they are not)
                c %= p
            if c != 0:
                which[k] = t
                coef[k] = p - c
                k += 1
        first = -1
        for a in range(m):
            i = free[a]
            x = work[i, j]
            if x < 0 or x >= p:
                x %= p
            if k:
                pending = 0
                for u in range(k):
                    x += coef[u] * basis[i, which[u]]
                    pending += 1
                    if pending == terms:
                        x %= p
                        pending = 0
                x %= p
            residual[a] = x
            if first < 0 and x != 0:
                first = a
        if first < 0:
            continue  # in the span of the columns kept before it
        q = free[first]
        scale = _inverse(residual[first], p)
        for a in range(m):
            residual[a] = residual[a] * scale % p
        # clear row q of the earlier vectors with the new one (its free rows only)
        k = 0
        for t in range(s):
            f = basis[q, t]
            if f != 0:
                which[k] = t
                coef[k] = p - f
                k += 1
        for a in range(m):
            v = residual[a]
            i = free[a]
            basis[i, s] = v
            if a == first or v == 0:
                continue
            for u in range(k):
                t = which[u]
                basis[i, t] = (basis[i, t] + coef[u] * v) % p
        for a in range(first, m - 1):
            free[a] = free[a + 1]
            residual[a] = residual[a + 1]
        m -= 1
        pivots[s] = q
        taken[s] = j
        s += 1
    for u in range(s):  # the pivot rows: the identity
        for t in range(s):
            basis[pivots[u], t] = 1 if t == u else 0
    return s


_SIGNATURE = "int64(int64[:, :], int64[::1], int64, int64, int64[:, ::1], int64[::1], int64[::1])"

#: `_independent_columns` compiled (same arguments: `work` int64 of any layout; `rows`,
#: `basis` (n, room), `pivots`, `taken` C-contiguous int64).
independent_columns = _compile(_independent_columns, _SIGNATURE)
