"""Exact arithmetic modulo a prime p < 2**31 with numpy.

Values are int64 in [0, p). A product of two values fits in int64 (< 2**62); dense matrix
products go through float64 BLAS on 16-bit limbs, where every partial sum stays below 2**53 and
is therefore exact, for inner dimensions below 2**20.
"""

from __future__ import annotations

import secrets

import numpy as np
import numpy.typing as npt

from safeaccess.rules.qss.eliminate import independent_columns

Int64Array = npt.NDArray[np.int64]

_LIMB = 1 << 16
#: Primes below this make products exact in one float64 matrix product for inner dimensions up
#: to 2**53 / p² (above 2 000 for p < 2**21).
SMALL_PRIME_LIMIT = 1 << 21
_MAX_INNER = 1 << 20
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3e24 (far above the primes used here)."""
    if n < 2:
        return False
    for q in _MR_BASES:
        if n % q == 0:
            return n == q
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def random_prime(low: int = 1 << 30, high: int = 1 << 31) -> int:
    """A uniformly drawn prime in [low, high), from the OS's secure random source: the adversary
    cannot aim a matrix at it."""
    while True:
        candidate = low + secrets.randbelow(high - low) | 1
        if candidate < high and is_prime(candidate):
            return candidate


def inverse(x: int, p: int) -> int:
    return pow(int(x) % p, p - 2, p)


def matmul(a: Int64Array, b: Int64Array, p: int) -> Int64Array:
    """(a @ b) mod p for int64 matrices with entries in [0, p)."""
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"shape mismatch {a.shape} @ {b.shape}")
    if a.shape[1] >= _MAX_INNER:
        raise ValueError("inner dimension too large for exact limb products")
    if a.size == 0 or b.size == 0:
        return np.zeros((a.shape[0], b.shape[1]), dtype=np.int64)
    if p < SMALL_PRIME_LIMIT and a.shape[1] < (1 << 53) // (p * p):
        # every product and partial sum stays below 2**53: one exact float product
        return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64) % p
    a_hi = (a >> 16).astype(np.float64)
    a_lo = (a & (_LIMB - 1)).astype(np.float64)
    b_hi = (b >> 16).astype(np.float64)
    b_lo = (b & (_LIMB - 1)).astype(np.float64)
    hh = (a_hi @ b_hi).astype(np.int64) % p
    mid = ((a_hi @ b_lo).astype(np.int64) + (a_lo @ b_hi).astype(np.int64)) % p
    ll = (a_lo @ b_lo).astype(np.int64) % p
    out = hh * _LIMB % p * _LIMB % p
    out = (out + mid * _LIMB) % p
    return (out + ll) % p


def matmul_01(a: Int64Array, b: npt.NDArray[np.int64 | np.float64], p: int) -> Int64Array:
    """(a @ b) mod p for `a` with entries in [0, p) and `b` a 0/1 matrix: one float64 product,
    exact while the inner dimension stays below 2**21 (each partial sum is below 2**52)."""
    if a.shape[1] >= 1 << 21:
        raise ValueError("inner dimension too large for an exact 0/1 product")
    if a.size == 0 or b.size == 0:
        return np.zeros((a.shape[0], b.shape[1]), dtype=np.int64)
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64) % p


def pivot_columns(matrix: Int64Array, p: int) -> list[int]:
    """Columns of a maximal linearly independent set of columns, by elimination mod p."""
    work = matrix.copy() % p
    n_rows, n_cols = work.shape
    pivots: list[int] = []
    rank = 0
    for col in range(n_cols):
        if rank == n_rows:
            break
        nonzero = np.flatnonzero(work[rank:, col])
        if nonzero.size == 0:
            continue
        row = rank + int(nonzero[0])
        if row != rank:
            work[[rank, row]] = work[[row, rank]]
        work[rank] = work[rank] * inverse(int(work[rank, col]), p) % p
        below = work[rank + 1 :, col].copy()
        hit = np.flatnonzero(below)
        if hit.size:
            rows = rank + 1 + hit
            work[rows] = (work[rows] - below[hit, None] * work[rank][None, :]) % p
        pivots.append(col)
        rank += 1
    return pivots


def invert(matrix: Int64Array, p: int) -> Int64Array | None:
    """The inverse mod p of a square matrix, or None when it is singular mod p."""
    n = matrix.shape[0]
    work = np.concatenate([matrix % p, np.eye(n, dtype=np.int64)], axis=1)
    for col in range(n):
        nonzero = np.flatnonzero(work[col:, col])
        if nonzero.size == 0:
            return None
        row = col + int(nonzero[0])
        if row != col:
            work[[col, row]] = work[[row, col]]
        work[col] = work[col] * inverse(int(work[col, col]), p) % p
        factors = work[:, col].copy()
        factors[col] = 0
        hit = np.flatnonzero(factors)
        if hit.size:
            work[hit] = (work[hit] - factors[hit, None] * work[col][None, :]) % p
    return work[:, n:].copy()


class ColumnBasis:
    """An incrementally built basis of a subspace of GF(p)^n, kept fully reduced on its pivot
    rows (vectors[pivots] is the identity), so reducing a batch of columns is one matrix product.

    Inserting a vector costs O(n · rank); a whole basis of GF(p)^n costs O(n³) over its life.
    Exact: every rank it reports is the rank over GF(p)."""

    def __init__(self, n: int, p: int, capacity: int | None = None) -> None:
        self.n = n
        self.p = p
        self._vectors = np.zeros((n, max(1, capacity if capacity is not None else n)), np.int64)
        self._pivots: list[int] = []

    @property
    def rank(self) -> int:
        return len(self._pivots)

    @property
    def vectors(self) -> Int64Array:
        """(n, rank): the basis vectors as columns."""
        return self._vectors[:, : self.rank]

    @property
    def pivots(self) -> Int64Array:
        return np.asarray(self._pivots, dtype=np.int64)

    def reduce(self, columns: Int64Array, zero_one: bool = False) -> Int64Array:
        """The residues of `columns` (n, b) modulo the span: zero on the pivot rows, and zero
        everywhere exactly for the columns inside the span. `zero_one`: the columns hold only
        0 and 1 (columns of query sets), which allows a single exact float product."""
        if self.rank == 0 or columns.shape[1] == 0:
            return columns % self.p
        # entries are in [0, p) (or 0/1): the difference needs one reduction, not two
        product = matmul_01 if zero_one else matmul
        return (columns - product(self.vectors, columns[self.pivots, :], self.p)) % self.p

    def insert(self, columns: Int64Array) -> list[int]:
        """Add the columns (n, b) in order, each one that is independent of the span so far;
        returns the positions of those added.

        The batch is reduced against the old vectors V in one product (none while the basis is
        empty), then read in order by the compiled loop of `eliminate.py`, which keeps the
        columns independent of those before them (a column met with s new vectors kept costs
        (n − rank − s) · s multiply-adds) and stops once the span is full: a wide batch of
        mostly independent columns costs little more than the columns it needs. Its new vectors
        W come fully reduced on their own pivot rows; V is cleared on the new pivot rows in one
        product, V − W·V[new pivots], at the end."""
        p = self.p
        room = self.n - self.rank
        if room == 0 or columns.shape[1] == 0:
            return []
        # an empty basis reduces nothing: the compiled loop takes the entries mod p itself
        work = self.reduce(columns) if self.rank else columns
        size = min(room, work.shape[1])
        if self.rank:
            free = np.ones(self.n, dtype=bool)
            free[self._pivots] = False
            rows = np.flatnonzero(free).astype(np.int64)
        else:
            rows = np.arange(self.n, dtype=np.int64)
        fresh = np.zeros((self.n, size), np.int64)  # W, one vector a column
        pivot_rows = np.zeros(size, np.int64)
        taken = np.zeros(size, np.int64)
        s = independent_columns(
            work.astype(np.int64, copy=False), rows, size, p, fresh, pivot_rows, taken
        )
        added = [int(x) for x in taken[:s]]
        new_pivots = [int(x) for x in pivot_rows[:s]]
        if not added:
            return added
        w = fresh[:, :s]
        r = self.rank
        if r + s > self._vectors.shape[1]:
            grown = np.zeros((self.n, max(r + s, 2 * self._vectors.shape[1])), np.int64)
            grown[:, :r] = self._vectors[:, :r]
            self._vectors = grown
        if r:
            old = self._vectors[:, :r]
            self._vectors[:, :r] = (old - matmul(w, old[new_pivots, :], p)) % p
        self._vectors[:, r : r + s] = w
        self._pivots.extend(new_pivots)
        return added

    def annihilator(self) -> Int64Array | None:
        """A nonzero y with yᵀv = 0 for every basis vector v, or None when the basis spans."""
        if self.rank == self.n:
            return None
        free = np.ones(self.n, dtype=bool)
        free[self.pivots] = False
        q = int(np.flatnonzero(free)[0])
        y = np.zeros(self.n, dtype=np.int64)
        y[q] = 1
        # yᵀV = y[P]ᵀ·I + y[q]·V[q, :] = 0
        if self.rank:
            y[self.pivots] = (-self.vectors[q, :]) % self.p
        return y


def _pow_mod(base: int, exponents: Int64Array, p: int) -> Int64Array:
    """base ** e mod p for each e >= 0, by squaring (products of values below p < 2**31 fit in
    int64)."""
    out = np.ones(exponents.shape[0], dtype=np.int64)
    e = exponents.copy()
    b = base % p
    while bool(np.any(e)):
        odd = (e & 1).astype(bool)
        out[odd] = out[odd] * b % p
        e >>= 1
        b = b * b % p
    return out


def float_mod(values: npt.NDArray[np.float64], p: int) -> Int64Array:
    """Each finite float as the exact rational it is (a dyadic m · 2**e), mod p: the weights of a
    weighted query set (the values the sandbox evaluated) over GF(p). Exact, so a rank found mod
    p bounds the rank over the rationals of the very floats admitted. Raises ValueError for a
    non-finite value."""
    v = np.asarray(values, dtype=np.float64)
    if not bool(np.all(np.isfinite(v))):
        raise ValueError("a weight is not a finite number")
    ones = v == 1.0
    if bool(ones.any()):  # most entries of a state's rows are 1 (its 0/1 query sets)
        out = np.ones(v.shape[0], dtype=np.int64)
        rest = np.flatnonzero(~ones)
        if rest.size:
            out[rest] = _float_mod(v[rest], p)
        return out
    return _float_mod(v, p)


def _float_mod(v: npt.NDArray[np.float64], p: int) -> Int64Array:
    mantissa, exponent = np.frexp(np.abs(v))
    # |v| = M · 2**(e − 53) with M = mantissa · 2**53 an integer below 2**53 (exact in int64)
    m_int = np.ldexp(mantissa, 53).astype(np.int64)
    shift = exponent.astype(np.int64) - 53
    out = m_int % p
    up = shift >= 0
    if bool(np.any(up)):
        out[up] = out[up] * _pow_mod(2, shift[up], p) % p
    if bool(np.any(~up)):
        half = inverse(2, p)
        out[~up] = out[~up] * _pow_mod(half, -shift[~up], p) % p
    negative = v < 0
    out[negative] = (p - out[negative]) % p
    return out


def mul_mod(a: Int64Array, b: Int64Array, p: int) -> Int64Array:
    """Elementwise a · b mod p for values in [0, p), p < 2**31 (the product fits in int64)."""
    return a * b % p
