"""Admitted aggregates as linear constraints over atoms, with the exact algebra of span mode.

Rows are admitted query sets (each a union of atoms) or weighted rows (a fit's design column
over value groups, issue 41: `data` holds each entry's weight, taken mod each lane's prime as
the exact rational the float is), stored sparse (CSR over atom ids); only
rows that are linearly independent of the rows kept before are kept, which loses nothing: a
dependence between query sets is a fact about records and survives every later split of atoms.

Each *lane* works modulo its own random prime p with random atom weights d (nonzero w.h.p.):
it keeps a basis I of the rows, K = M D Mᵀ for M = A_I (invertible mod p) and K⁻¹, grown by a
Schur complement when rows are added, so every admission costs R × R work, not work over atoms.
A random vector w gives v = w − D Mᵀ K⁻¹ M w, a uniformly random null vector of the rows; a set
of atoms S is determined by the released aggregates exactly when Σ_S v = 0 for every null vector.

Two lanes with independent primes guard the one way exact arithmetic mod p can err towards
releasing: a row independent over the rationals but dependent mod p (p divides a minor). A set
is taken as determined when either lane finds it so.

When an atom splits, its pieces get random weights that sum to the atom's weight, so K and K⁻¹
(whose rows are unions of atoms) are unchanged, and the weights stay uniformly random.

Each lane also keeps a *sketch*: `SKETCHES` more random weights per atom, independent of d and
split the same way, and their sum over every kept row. A new row the lane calls dependent comes
with its coefficients μ over the basis; it is checked by comparing its own sketch with μ times
the basis rows' sketches, O(R) per row instead of a pass over every row's entries. A row that
is not that combination mod p passes with probability p^-SKETCHES per lane (its difference from
the combination is a nonzero vector over atoms, and the weights are uniform and independent).
Sketches are not encoded: a decoded state draws fresh ones (one pass over the rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from safeaccess.rules.qss import modp, repeats
from safeaccess.rules.qss.kept import KeptSets

Int32Array = npt.NDArray[np.int32]
Int64Array = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

N_LANES = 2
#: Independent sketch weight vectors per lane (see the module docstring).
SKETCHES = 2
_LO = (1 << 16) - 1
#: Below this many terms per key, a float64 bincount of values below 2**31 is exact (< 2**53).
_EXACT_TERMS = 1 << 22


class LaneFailure(Exception):
    """A lane's random weights made an independent row look singular (probability ~ R/p);
    the admission is refused rather than trusting a possibly incomplete basis."""


def _bincount_mod(
    keys: Int64Array, weights: Int64Array, size: int, p: int, max_terms: int | None = None
) -> Int64Array:
    """Exact Σ weights per key, mod p (weights in [0, p), p < 2**31). With fewer than 2**22
    terms per key (`max_terms`, a bound the caller knows, or all the keys) every float64 partial
    sum is below 2**53 and one pass is exact; otherwise 16-bit limbs keep them exact."""
    if min(keys.shape[0], max_terms if max_terms is not None else keys.shape[0]) < _EXACT_TERMS:
        return (
            np.bincount(keys, weights=weights.astype(np.float64), minlength=size).astype(np.int64)
            % p
        )
    lo = np.bincount(keys, weights=(weights & _LO).astype(np.float64), minlength=size)
    hi = np.bincount(keys, weights=(weights >> 16).astype(np.float64), minlength=size)
    return (hi.astype(np.int64) % p * (1 << 16) + lo.astype(np.int64)) % p


@dataclass(frozen=True)
class Lane:
    """One exact random projection: prime, atom weights, basis rows, K_I and its inverse."""

    p: int
    d: Int64Array  # (m,) in [1, p) w.h.p.
    basis: Int64Array  # (r,) row ids
    k_mat: Int64Array  # (r, r)
    k_inv: Int64Array  # (r, r)
    # sketch weights (m, SKETCHES) and their sums over every row (R, SKETCHES), mod p; None
    # until first needed (a decoded state: `with_sketch` draws them)
    sketch: Int64Array | None = None
    sketch_rows: Int64Array | None = None

    @classmethod
    def fresh(cls, n_atoms: int, rng: np.random.Generator) -> Lane:
        p = modp.random_prime()
        return cls(
            p=p,
            d=rng.integers(1, p, size=n_atoms, dtype=np.int64),
            basis=np.empty(0, dtype=np.int64),
            k_mat=np.zeros((0, 0), dtype=np.int64),
            k_inv=np.zeros((0, 0), dtype=np.int64),
            sketch=rng.integers(0, p, size=(n_atoms, SKETCHES), dtype=np.int64),
            sketch_rows=np.zeros((0, SKETCHES), dtype=np.int64),
        )


def _split_weights(
    w: Int64Array, parent: Int64Array, m_old: int, p: int, rng: np.random.Generator
) -> Int64Array:
    """Weights over the atoms after a split: each piece a fresh uniform weight, the parent (which
    keeps its id for one piece) what is left, so every row's sum is unchanged."""
    fresh = rng.integers(1, p, size=parent.shape[0], dtype=np.int64)
    taken = np.bincount(parent, weights=fresh.astype(np.float64), minlength=m_old)
    out = np.concatenate([w, fresh])
    out[:m_old] = (w - taken.astype(np.int64) % p) % p
    return out


@dataclass(frozen=True)
class Constraints:
    """Rows over atoms (CSR) and the lanes' algebra over them."""

    n_atoms: int
    indptr: Int64Array  # (R + 1,)
    indices: Int32Array  # (nnz,) atom ids
    lanes: tuple[Lane, ...]
    origin: Int32Array  # (R,) the admission each row came in with (-1: unknown, older states)
    # the rank certificate's completing sets over these rows, kept for the next admission
    # (None: decide from scratch next time); split and add_rows drop it, admit carries it over
    kept: KeptSets | None = None
    #: rows met before by their sketch key (`repeats.py`): kept rows by id, rows found dependent
    #: by their dependency. Not encoded: a decoded state draws fresh sketches, then remembers
    #: its kept rows only
    seen: Mapping[repeats.Key, int | repeats.SeenRow] = field(default_factory=dict)
    #: each entry's weight (the float the sandbox evaluated) when some row is weighted (a fit's
    #: design column over its value groups, issue 41); None when every entry is 1 (query sets)
    data: FloatArray | None = None
    #: `values` by prime, with the weights they were taken of (a copy made by `replace` shares
    #: the cache, and an entry is used only for the very array it was computed from)
    _values: dict[int, tuple[FloatArray, Int64Array]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def weighted(self) -> bool:
        return self.data is not None

    def values(self, p: int) -> Int64Array:
        """Each entry's weight mod p (its exact rational: `modp.float_mod`); ones when 0/1.
        Read-only (kept for the next call with the same prime)."""
        if self.data is None:
            return np.ones(self.nnz, dtype=np.int64)
        found = self._values.get(p)
        if found is not None and found[0] is self.data:
            return found[1]
        out = modp.float_mod(self.data, p)
        out.setflags(write=False)
        self._values[p] = (self.data, out)
        return out

    @classmethod
    def empty(cls, n_atoms: int, rng: np.random.Generator | None = None) -> Constraints:
        rng = rng if rng is not None else _secure_rng()
        return cls(
            n_atoms=n_atoms,
            indptr=np.zeros(1, dtype=np.int64),
            indices=np.empty(0, dtype=np.int32),
            lanes=tuple(Lane.fresh(n_atoms, rng) for _ in range(N_LANES)),
            origin=np.empty(0, dtype=np.int32),
        )

    @property
    def n_rows(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    @property
    def rank(self) -> int:
        return max((int(lane.basis.shape[0]) for lane in self.lanes), default=0)

    def row_of_entry(self) -> Int64Array:
        return np.repeat(np.arange(self.n_rows, dtype=np.int64), np.diff(self.indptr))

    def with_new_atom(self) -> Constraints:
        """One more atom that no row contains (new record ids outside everything)."""
        rng = _secure_rng()
        lanes = tuple(
            replace(
                lane,
                d=np.concatenate([lane.d, rng.integers(1, lane.p, 1, dtype=np.int64)]),
                sketch=None
                if lane.sketch is None
                else np.concatenate(
                    [lane.sketch, rng.integers(0, lane.p, (1, SKETCHES), dtype=np.int64)]
                ),
            )
            for lane in self.lanes
        )
        return replace(self, n_atoms=self.n_atoms + 1, lanes=lanes)

    def with_sketch(self) -> Constraints:
        """The same constraints with every lane's sketch drawn (one pass over the rows' entries
        for a lane that has none: a state just decoded)."""
        if all(lane.sketch is not None for lane in self.lanes):
            return self
        rng = _secure_rng()
        rows = self.row_of_entry()
        lanes = []
        for lane in self.lanes:
            if lane.sketch is None:
                w = rng.integers(0, lane.p, size=(self.n_atoms, SKETCHES), dtype=np.int64)
                vals = self.values(lane.p)
                sums = np.stack(
                    [
                        _bincount_mod(
                            rows,
                            w[self.indices, s] * vals % lane.p,
                            self.n_rows,
                            lane.p,
                            self.n_atoms,
                        )
                        for s in range(SKETCHES)
                    ],
                    axis=1,
                ).reshape(self.n_rows, SKETCHES)
                lane = replace(lane, sketch=w, sketch_rows=sums)
            lanes.append(lane)
        # rows remembered by their old sketches cannot be recognised by the new ones
        seen = repeats.remembered(
            [lane.sketch_rows for lane in lanes if lane.sketch_rows is not None]
        )
        return replace(self, lanes=tuple(lanes), seen=seen)

    def split(self, parent: Int64Array, rng: np.random.Generator) -> Constraints:
        """Atoms n_atoms.. are fresh pieces of atoms `parent`: rows containing a parent now
        contain its pieces, and the pieces' weights sum to the parent's weight."""
        if parent.size == 0:
            return self
        m_old = self.n_atoms
        m_new = m_old + int(parent.shape[0])
        n_children = np.bincount(parent, minlength=m_old)
        lanes = []
        for lane in self.lanes:
            d = _split_weights(lane.d, parent, m_old, lane.p, rng)
            sketch = lane.sketch
            if sketch is not None:
                sketch = np.stack(
                    [
                        _split_weights(sketch[:, s], parent, m_old, lane.p, rng)
                        for s in range(SKETCHES)
                    ],
                    axis=1,
                )
            lanes.append(replace(lane, d=d, sketch=sketch))
        indptr, indices, data = self.indptr, self.indices, self.data
        # only the entries of atoms that split change: their pieces are added at the end of the
        # entry's row (the order of atoms within a row means nothing), in one insertion pass
        counts = n_children[indices]
        hit = np.flatnonzero(counts)
        if hit.size:
            children = np.argsort(parent, kind="stable").astype(np.int64) + m_old
            child_start = np.concatenate([[0], np.cumsum(n_children)]).astype(np.int64)
            per_hit = counts[hit].astype(np.int64)
            first = np.repeat(child_start[indices[hit]], per_hit)
            rank = np.arange(int(per_hit.sum()), dtype=np.int64) - np.repeat(
                np.cumsum(per_hit) - per_hit, per_hit
            )
            pieces = children[first + rank]
            row_of_hit = np.searchsorted(indptr, hit, side="right") - 1
            at = np.repeat(indptr[row_of_hit + 1], per_hit)
            indices = np.insert(indices, at, pieces.astype(np.int32))
            if data is not None:  # a piece has its parent's weight in every row
                data = np.insert(data, at, np.repeat(data[hit], per_hit))
            added = np.bincount(row_of_hit, weights=per_hit, minlength=self.n_rows)
            indptr = indptr + np.concatenate([[0], np.cumsum(added.astype(np.int64))])
        # a split keeps every row's sketch (the pieces' weights sum to the parent's): the rows
        # remembered stay recognisable
        return Constraints(
            n_atoms=m_new,
            indptr=indptr,
            indices=indices,
            lanes=tuple(lanes),
            origin=self.origin,
            seen=self.seen,
            data=data,
        )


def _secure_rng() -> np.random.Generator:
    import secrets

    return np.random.default_rng(secrets.randbits(128))


#: A new row's place in its output: (query-set array, cell index).
CellKey = tuple[int, int]


@dataclass(frozen=True)
class Dependency:
    """A new row the records make a combination of kept rows: row = Σ coefficients · rows,
    mod p (exact in a lane whose basis holds every kept row). Whether this equation also
    holds by the outputs' definitions, or only in these data, is for the caller to tell."""

    key: CellKey
    p: int
    rows: Int64Array  # kept row ids with a nonzero coefficient
    coefficients: Int64Array  # in [1, p)


@dataclass(frozen=True)
class Candidate:
    """Constraints with a new output's rows added (those independent in some lane), and the
    dependencies of the new rows every lane found dependent."""

    constraints: Constraints
    n_new_rows: int
    kept_keys: list[CellKey] = field(default_factory=list)  # of the rows added, in row order
    dependencies: list[Dependency] = field(default_factory=list)
    #: dropped rows whose sketch disagrees with their dependency in some lane (must be 0)
    unverified: int = 0


def _row_layout(cells: list[Int32Array]) -> tuple[Int64Array, Int64Array, list[CellKey]]:
    """The atom count of each new row (one per distinct cell of each array), each array's offset
    and each row's (array, cell)."""
    lengths: list[Int64Array] = []
    keys: list[CellKey] = []
    offsets = []
    n_rows = 0
    for g, cell in enumerate(cells):
        offsets.append(n_rows)
        inner = cell[cell >= 0]
        counts = np.bincount(inner, minlength=0).astype(np.int64)
        lengths.append(counts)
        keys.extend((g, c) for c in range(counts.shape[0]))
        n_rows += int(counts.shape[0])
    joined = np.concatenate(lengths) if lengths else np.empty(0, np.int64)
    return joined, np.asarray(offsets, dtype=np.int64), keys


def _row_atoms(cell: Int32Array, wanted: Int64Array) -> list[Int64Array]:
    """The atom ids of the cells `wanted` of one array, in atom order."""
    inside = np.flatnonzero(cell >= 0)
    values = cell[inside]
    if values.size and int(values.max()) < np.iinfo(np.int16).max:
        values = values.astype(np.int16)  # a stable sort of 16-bit keys is a radix sort
    order = inside[np.argsort(values, kind="stable")]
    bounds = np.searchsorted(cell[order], np.stack([wanted, wanted + 1]))
    return [order[lo:hi].astype(np.int64) for lo, hi in zip(bounds[0], bounds[1], strict=True)]


def _cross_products(
    constraints: Constraints,
    new_index: list[Int64Array],
    n_new: int,
    lane_weights: list[LaneWeights] | None = None,
) -> list[Int64Array]:
    """Per lane, C = M D Nᵀ mod p: (n_rows, n_new), Σ of the lane's atom weights over each kept
    row ∩ new row. One sparse product for every lane: the rows (0/1, CSR) times the new rows'
    weighted columns. Each entry sums at most one weight below 2**31 per atom, so with fewer
    than 2**22 atoms every float64 partial sum is below 2**53 and the product is exact; above
    that the sums go through 16-bit limbs."""
    m, n_rows, lanes = constraints.n_atoms, constraints.n_rows, constraints.lanes
    if n_rows == 0 or n_new == 0:
        return [np.zeros((n_rows, n_new), np.int64) for _ in lanes]
    inside = [np.flatnonzero(idx >= 0) for idx in new_index]
    atoms = np.concatenate(inside)
    cols = np.concatenate([idx[a] for idx, a in zip(new_index, inside, strict=True)])
    rows = sp.csr_matrix(
        (np.ones(constraints.nnz, np.float64), constraints.indices, constraints.indptr),
        shape=(n_rows, m),
    )
    limbs: list[tuple[int, int]] = [(0, 0)] if m < _EXACT_TERMS else [(0, _LO), (16, _LO)]
    blocks = []
    for i, lane in enumerate(lanes):
        w = lane.d[atoms]
        if lane_weights is not None and any(x is not None for x in lane_weights[i]):
            # a weighted new row: d · weight mod p per atom, still below 2**31 (the kept rows
            # are read as 0/1 here: `_cross_products_mixed` redoes the weighted ones)
            mult = np.concatenate(
                [
                    np.ones(a.shape[0], np.int64) if wm is None else wm[a]
                    for wm, a in zip(lane_weights[i], inside, strict=True)
                ]
            )
            w = w * mult % lane.p
        for shift, mask in limbs:
            blocks.append(((w >> shift) & mask if mask else w).astype(np.float64))
    n_blocks = len(blocks)
    weighted = sp.csr_matrix(
        (
            np.concatenate(blocks),
            (
                np.tile(atoms, n_blocks),
                np.concatenate([cols + b * n_new for b in range(n_blocks)]),
            ),
        ),
        shape=(m, n_blocks * n_new),
    )
    product = (rows @ weighted).toarray().astype(np.int64)
    out = []
    per_lane = len(limbs)
    for i, lane in enumerate(lanes):
        part = [
            product[:, (i * per_lane + j) * n_new : (i * per_lane + j + 1) * n_new]
            for j in range(per_lane)
        ]
        if per_lane == 1:
            out.append(part[0] % lane.p)
        else:
            out.append((part[1] % lane.p * (1 << 16) + part[0]) % lane.p)
    return out


def _new_sketches(
    lanes: tuple[Lane, ...], new_index: list[Int64Array], inside: list[Int64Array], n_new: int
) -> list[Int64Array]:
    """Each new row's sketch in each lane: Σ of the lane's sketch weights over its atoms.

    With fewer than 2**22 atoms every lane and sketch is summed in one sparse product per array
    (the array's 0/1 rows over atoms times the (atoms × lanes·SKETCHES) weights): each sum holds
    at most one weight below 2**31 per atom, so float64 is exact. Above, per-key 16-bit limbs."""
    m = int(lanes[0].d.shape[0]) if lanes else 0
    if m >= _EXACT_TERMS:
        return [_new_sketches_limbs(lane, new_index, inside, n_new) for lane in lanes]
    weights = np.empty((m, len(lanes) * SKETCHES), dtype=np.float64)
    for i, lane in enumerate(lanes):
        assert lane.sketch is not None
        weights[:, i * SKETCHES : (i + 1) * SKETCHES] = lane.sketch
    sums = np.zeros((n_new, len(lanes) * SKETCHES), dtype=np.int64)
    for idx, atoms in zip(new_index, inside, strict=True):
        if atoms.size == 0:
            continue
        # CSC over atoms: column a holds the one new row atom a is in (if any)
        indptr = np.zeros(m + 1, dtype=np.int64)
        indptr[atoms + 1] = 1
        np.cumsum(indptr, out=indptr)
        rows = sp.csc_matrix(
            (np.ones(atoms.shape[0]), idx[atoms], indptr), shape=(n_new, m), copy=False
        )
        sums += (rows @ weights).astype(np.int64)
    return [sums[:, i * SKETCHES : (i + 1) * SKETCHES] % lane.p for i, lane in enumerate(lanes)]


def _new_sketches_limbs(
    lane: Lane, new_index: list[Int64Array], inside: list[Int64Array], n_new: int
) -> Int64Array:
    """One lane's new-row sketches through exact per-key sums (any number of atoms)."""
    assert lane.sketch is not None
    p, m = lane.p, int(lane.d.shape[0])
    out = np.zeros((n_new, SKETCHES), dtype=np.int64)
    for idx, atoms in zip(new_index, inside, strict=True):
        for t in range(SKETCHES):
            sums = _bincount_mod(idx[atoms], lane.sketch[atoms, t], n_new, p, m)
            out[:, t] = (out[:, t] + sums) % p
    return out


def _pair_entries(
    new_index: list[Int64Array], n_new: int
) -> tuple[Int64Array, Int64Array, Int64Array, Int64Array]:
    """For E = N D Nᵀ: a key (row · n_new + row) and the atom of each shared atom of each pair of
    new rows, and the two arrays the pair's rows come from (for their weights)."""
    pair_keys: list[Int64Array] = []
    pair_atoms: list[Int64Array] = []
    pair_g: list[Int64Array] = []
    pair_h: list[Int64Array] = []
    for g, idx in enumerate(new_index):
        for h in range(g, len(new_index)):
            jh = new_index[h]
            both = np.flatnonzero((idx >= 0) & (jh >= 0))
            if both.size == 0:
                continue
            sides = np.full(both.shape[0], g, np.int64), np.full(both.shape[0], h, np.int64)
            pair_keys.append(idx[both] * n_new + jh[both])
            pair_atoms.append(both.astype(np.int64))
            pair_g.append(sides[0])
            pair_h.append(sides[1])
            if h != g:
                pair_keys.append(jh[both] * n_new + idx[both])
                pair_atoms.append(both.astype(np.int64))
                pair_g.append(sides[1])
                pair_h.append(sides[0])

    def joined(parts: list[Int64Array]) -> Int64Array:
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    return joined(pair_keys), joined(pair_atoms), joined(pair_g), joined(pair_h)


#: Per array of new rows, each atom's weight mod a lane's prime (None: the array is 0/1).
LaneWeights = list[Int64Array | None]


def _weights_mod(weights: list[FloatArray | None], p: int) -> LaneWeights:
    return [None if w is None else modp.float_mod(w, p) for w in weights]


def _cross_products_weighted(
    constraints: Constraints,
    new_index: list[Int64Array],
    n_new: int,
    lane_weights: list[LaneWeights],
) -> list[Int64Array]:
    """`_cross_products` when a kept row or a new row is weighted: each term M[r, a] · d[a] ·
    N[j, a] is reduced mod p as an integer (a product of two values below 2**31 fits in int64)
    and the terms of each (row, new row) are summed exactly (`_bincount_mod`)."""
    n_rows = constraints.n_rows
    if n_rows == 0 or n_new == 0:
        return [np.zeros((n_rows, n_new), np.int64) for _ in constraints.lanes]
    row_of = constraints.row_of_entry()
    entry_atoms = constraints.indices.astype(np.int64)
    out = []
    for lane, weights in zip(constraints.lanes, lane_weights, strict=True):
        p = lane.p
        vals = constraints.values(p)
        keys: list[Int64Array] = []
        terms: list[Int64Array] = []
        for idx, w in zip(new_index, weights, strict=True):
            col = idx[entry_atoms]
            hit = np.flatnonzero(col >= 0)
            if hit.size == 0:
                continue
            atoms = entry_atoms[hit]
            term = vals[hit] * lane.d[atoms] % p
            if w is not None:
                term = term * w[atoms] % p
            keys.append(row_of[hit] * n_new + col[hit])
            terms.append(term)
        if not keys:
            out.append(np.zeros((n_rows, n_new), np.int64))
            continue
        sums = _bincount_mod(
            np.concatenate(keys), np.concatenate(terms), n_rows * n_new, p, constraints.n_atoms
        )
        out.append(sums.reshape(n_rows, n_new))
    return out


def _cross_products_mixed(
    constraints: Constraints,
    new_index: list[Int64Array],
    n_new: int,
    lane_weights: list[LaneWeights],
) -> list[Int64Array]:
    """`_cross_products` with weighted rows among the kept or the new ones: every kept row
    read as 0/1 against the new rows' weighted columns by the one sparse product (exact: each
    term is one value below 2**31), then the weighted kept rows (a state's rows are mostly
    query sets) again, exactly (`_cross_products_weighted`, over their own entries only)."""
    out = _cross_products(constraints, new_index, n_new, lane_weights)
    data = constraints.data
    if data is not None and constraints.n_rows and n_new:
        weighted_rows = np.unique(constraints.row_of_entry()[data != 1.0])
        if weighted_rows.size:
            sub = _rows_subset(constraints, weighted_rows)
            exact = _cross_products_weighted(sub, new_index, n_new, lane_weights)
            for lane_out, fixed in zip(out, exact, strict=True):
                lane_out[weighted_rows] = fixed
    return out


def _rows_subset(constraints: Constraints, rows: Int64Array) -> Constraints:
    """The constraints' rows `rows` alone (same atoms, lanes and weights): for products."""
    lengths = np.diff(constraints.indptr)[rows]
    starts = constraints.indptr[rows]
    take = np.concatenate([np.arange(a, a + n) for a, n in zip(starts, lengths, strict=True)])
    data = constraints.data
    return replace(
        constraints,
        indptr=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        indices=constraints.indices[take],
        data=None if data is None else data[take],
        origin=constraints.origin[rows],
        _values={},
    )


def _new_sketches_weighted(
    lane: Lane,
    new_index: list[Int64Array],
    inside: list[Int64Array],
    n_new: int,
    weights: LaneWeights,
) -> Int64Array:
    """One lane's new-row sketches when some new row is weighted: Σ sketch · weight mod p."""
    assert lane.sketch is not None
    p, m = lane.p, int(lane.d.shape[0])
    out = np.zeros((n_new, SKETCHES), dtype=np.int64)
    for idx, atoms, w in zip(new_index, inside, weights, strict=True):
        for t in range(SKETCHES):
            vals = lane.sketch[atoms, t]
            if w is not None:
                vals = vals * w[atoms] % p
            sums = _bincount_mod(idx[atoms], vals, n_new, p, m)
            out[:, t] = (out[:, t] + sums) % p
    return out


@dataclass(frozen=True)
class _LaneStep:
    """One lane's part of adding the fresh rows (positions among the fresh rows)."""

    k_mat: Int64Array
    k_inv: Int64Array
    picked: Int64Array  # fresh positions this lane keeps, in order
    rest: Int64Array  # fresh positions it finds dependent
    mu: Int64Array  # (basis after, rest.size): each dependent row's coefficients


def _lane_step(lane: Lane, c: Int64Array, e: Int64Array) -> _LaneStep:
    """Grow one lane's K and K⁻¹ by the fresh rows it finds independent (a Schur complement),
    and solve each other fresh row's dependency. `c` = M_I D Nᵀ (basis × fresh), `e` = N D Nᵀ."""
    p = lane.p
    n_fresh = int(e.shape[0])
    u = modp.matmul(lane.k_inv, c, p)
    schur = (e - modp.matmul(c.T.copy(), u, p)) % p
    picked = np.asarray(modp.pivot_columns(schur, p), dtype=np.int64)
    rest = np.setdiff1d(np.arange(n_fresh, dtype=np.int64), picked)
    if picked.size == 0:
        # every fresh row is dependent on the basis: K μ = c, μ = K⁻¹ c = u
        return _LaneStep(lane.k_mat, lane.k_inv, picked, rest, u[:, rest])
    s_inv = modp.invert(schur[np.ix_(picked, picked)], p)
    if s_inv is None:
        raise LaneFailure("Schur complement singular on independent rows")
    c_j = c[:, picked]
    u_j = u[:, picked]
    t_mat = modp.matmul(u_j, s_inv, p)
    top_left = (lane.k_inv + modp.matmul(t_mat, u_j.T.copy(), p)) % p
    top_right = (-t_mat) % p
    k_inv = np.block([[top_left, top_right], [top_right.T, s_inv]])
    k_mat = np.block([[lane.k_mat, c_j], [c_j.T, e[np.ix_(picked, picked)]]])
    # A dependent fresh row solves K' μ = [c_rest; e_picked,rest] over the grown basis. By the
    # block form of K'⁻¹ (z = the Schur complement's picked × rest block):
    # μ_new = S⁻¹ z and μ_old = u_rest − T z, with no product by the whole of K'⁻¹.
    z = schur[np.ix_(picked, rest)]
    mu_new = modp.matmul(s_inv, z, p)
    mu_old = (u[:, rest] - modp.matmul(t_mat, z, p)) % p
    return _LaneStep(k_mat, k_inv, picked, rest, np.vstack([mu_old, mu_new]))


def add_rows(
    constraints: Constraints,
    cells: list[Int32Array],
    origin: int = -1,
    weights: list[FloatArray | None] | None = None,
) -> Candidate:
    """Add the rows given by cell arrays over the current atoms (one per query-set array); the
    rows kept are tagged with `origin` (the admission they come from). A new row no lane keeps
    is checked against its dependency in every lane by the sketches (`Candidate.unverified`).

    `weights[g]` (None: 0/1) gives each atom's weight in the rows of array g (a weighted row: a
    fit's design column over its value groups, nonzero on the atoms its cells hold); the
    algebra is the same, each weight taken mod each lane's prime as the exact rational it is.

    A new row equal to a kept row, or to a row found dependent before (`repeats.py`), takes its
    known dependency; the lanes' algebra runs on the other (*fresh*) rows only."""
    constraints = constraints.with_sketch()
    row_lengths, offsets, row_keys = _row_layout(cells)
    nonempty = [int(j) for j in np.flatnonzero(row_lengths)]
    n_new = int(row_lengths.shape[0])
    m = constraints.n_atoms
    # new-row index of each atom, per array (an atom is in at most one cell of an array)
    new_index = []
    for g, cell in enumerate(cells):
        idx = np.where(cell >= 0, cell.astype(np.int64) + offsets[g], -1)
        new_index.append(idx)
    inside = [np.flatnonzero(idx >= 0) for idx in new_index]
    row_weights: list[FloatArray | None] = list(weights) if weights else [None] * len(cells)
    weighted = constraints.weighted or any(w is not None for w in row_weights)
    no_weights: LaneWeights = [None] * len(cells)
    lane_weights: list[LaneWeights] = [
        _weights_mod(row_weights, lane.p) if weighted else no_weights for lane in constraints.lanes
    ]
    if weighted:
        lane_sketch_new = [
            _new_sketches_weighted(lane, new_index, inside, n_new, w)
            for lane, w in zip(constraints.lanes, lane_weights, strict=True)
        ]
    else:
        lane_sketch_new = _new_sketches(constraints.lanes, new_index, inside, n_new)
    new_keys = dict(zip(nonempty, repeats.keys_of(lane_sketch_new, nonempty), strict=True))
    # a remembered dependency is used only if it covers every lane that holds every kept row
    # (a lane that holds them now held them then: a lane's basis only grows)
    full_now = [int(lane.basis.shape[0]) == constraints.n_rows for lane in constraints.lanes]

    def usable(found: int | repeats.SeenRow) -> bool:
        return isinstance(found, int) or all(
            t is not None for t, full in zip(found.terms, full_now, strict=True) if full
        )

    known = {
        j: constraints.seen[key]
        for j, key in new_keys.items()
        if key in constraints.seen and usable(constraints.seen[key])
    }
    fresh = np.asarray([j for j in nonempty if j not in known], dtype=np.int64)
    n_fresh = int(fresh.size)
    # each atom's fresh row (its position among the fresh rows), per array; -1 maps to -1
    position = np.full(n_new + 1, -1, dtype=np.int64)
    position[fresh] = np.arange(n_fresh, dtype=np.int64)
    fresh_index = [position[idx] for idx in new_index]
    # C = M D Nᵀ for every lane at once (all rows; each lane takes its basis rows)
    if not n_fresh:
        c_all = [np.zeros((constraints.n_rows, 0), np.int64) for _ in constraints.lanes]
    elif weighted:
        c_all = _cross_products_mixed(constraints, fresh_index, n_fresh, lane_weights)
    else:
        c_all = _cross_products(constraints, fresh_index, n_fresh)
    e_keys, e_atoms, e_g, e_h = (
        _pair_entries(fresh_index, n_fresh) if n_fresh else (None, None, None, None)
    )
    kept_any = np.zeros(n_new, dtype=bool)
    steps: list[_LaneStep] = []
    for lane_no, lane in enumerate(constraints.lanes):
        p = lane.p
        if n_fresh:
            assert e_keys is not None and e_atoms is not None
            e_terms = lane.d[e_atoms]
            if weighted:
                assert e_g is not None and e_h is not None
                for g, lane_w in enumerate(lane_weights[lane_no]):
                    if lane_w is None:
                        continue
                    for side in (e_g, e_h):
                        at = np.flatnonzero(side == g)
                        e_terms[at] = e_terms[at] * lane_w[e_atoms[at]] % p
            e = _bincount_mod(e_keys, e_terms, n_fresh * n_fresh, p, m).reshape(n_fresh, n_fresh)
        else:
            e = np.zeros((0, 0), np.int64)
        step = _lane_step(lane, c_all[lane_no][lane.basis], e)
        steps.append(step)
        kept_any[fresh[step.picked]] = True
    # a fresh row no lane kept must be, in every lane, the combination μ that lane found
    unverified = 0
    for lane, step, sk_new in zip(constraints.lanes, steps, lane_sketch_new, strict=True):
        assert lane.sketch_rows is not None
        dropped_here = np.flatnonzero(~kept_any[fresh[step.rest]])
        if dropped_here.size == 0:
            continue
        basis_sketch = np.vstack([lane.sketch_rows[lane.basis], sk_new[fresh[step.picked]]])
        claimed = modp.matmul(step.mu[:, dropped_here].T.copy(), basis_sketch, lane.p)
        unverified += int(np.any(claimed != sk_new[fresh[step.rest[dropped_here]]], axis=1).sum())
    # rows kept in some lane get ids after the existing rows
    kept = np.flatnonzero(kept_any)
    new_id = np.full(n_new, -1, dtype=np.int64)
    new_id[kept] = constraints.n_rows + np.arange(kept.size, dtype=np.int64)
    indptr, indices, data = constraints.indptr, constraints.indices, constraints.data
    if weighted and data is None:
        data = np.ones(constraints.nnz, dtype=np.float64)
    if kept.size:  # (nothing to copy when every new row is dependent)
        indptr = np.concatenate(
            [constraints.indptr, constraints.indptr[-1] + np.cumsum(row_lengths[kept])]
        )
        array_of = np.searchsorted(offsets, kept, side="right") - 1
        pieces = []
        piece_weights: list[FloatArray] = []
        for g in np.unique(array_of):
            rows_here = kept[array_of == g]
            found_atoms = _row_atoms(cells[int(g)], rows_here - offsets[g])
            pieces += found_atoms
            row_w = row_weights[int(g)]
            piece_weights += [
                np.ones(a.shape[0], np.float64) if row_w is None else row_w[a].astype(np.float64)
                for a in found_atoms
            ]
        indices = np.concatenate(
            [constraints.indices] + [atoms.astype(np.int32) for atoms in pieces]
        )
        if data is not None:
            data = np.concatenate([data, *piece_weights])
    out_lanes = []
    bases = []
    for lane, step, sk_new in zip(constraints.lanes, steps, lane_sketch_new, strict=True):
        assert lane.sketch_rows is not None
        basis = np.concatenate([lane.basis, new_id[fresh[step.picked]]]).astype(np.int64)
        bases.append(basis)
        out_lanes.append(
            replace(
                lane,
                basis=basis,
                k_mat=step.k_mat,
                k_inv=step.k_inv,
                sketch_rows=np.vstack([lane.sketch_rows, sk_new[kept]]),
            )
        )
    n_rows_after = constraints.n_rows + int(kept.size)
    # each dropped row's dependency in every lane that holds every kept row (None elsewhere)
    terms: dict[int, list[tuple[Int64Array, Int64Array] | None]] = {
        j: [] for j in nonempty if not kept_any[j]
    }
    for lane_no, (step, basis) in enumerate(zip(steps, bases, strict=True)):
        full = basis.shape[0] == n_rows_after
        where = {int(fresh[r]): col for col, r in enumerate(step.rest)}
        for j, lane_terms in terms.items():
            if not full:
                lane_terms.append(None)
                continue
            found = known.get(j)
            if isinstance(found, int):
                lane_terms.append((np.asarray([found], np.int64), np.ones(1, np.int64)))
            elif found is not None:
                lane_terms.append(found.terms[lane_no])
            else:
                mu_j = step.mu[:, where[j]]
                nz = np.flatnonzero(mu_j)
                lane_terms.append((basis[nz].astype(np.int64), mu_j[nz].astype(np.int64)))
    dependencies: list[Dependency] = []
    for lane_no, lane in enumerate(constraints.lanes):
        for j, lane_terms in terms.items():
            pair = lane_terms[lane_no]
            if pair is not None:
                dependencies.append(
                    Dependency(key=row_keys[j], p=lane.p, rows=pair[0], coefficients=pair[1])
                )
    # remember the fresh rows, kept or found dependent, for later admissions that repeat them
    seen = dict(constraints.seen)
    for j in (int(x) for x in fresh):
        seen.setdefault(
            new_keys[j],
            int(new_id[j]) if kept_any[j] else repeats.SeenRow(terms=tuple(terms[j])),
        )
    return Candidate(
        constraints=Constraints(
            n_atoms=m,
            indptr=indptr,
            indices=indices,
            lanes=tuple(out_lanes),
            origin=np.concatenate(
                [constraints.origin, np.full(kept.size, origin, dtype=np.int32)]
            ).astype(np.int32),
            seen=seen,
            data=data,
        ),
        n_new_rows=len(nonempty),
        kept_keys=[row_keys[int(x)] for x in kept],
        dependencies=dependencies,
        unverified=unverified,
    )


def null_vector(constraints: Constraints, lane: Lane, rng: np.random.Generator) -> Int64Array:
    """A uniformly random vector of the null space of the lane's basis rows, mod its prime."""
    p = lane.p
    m = constraints.n_atoms
    w = rng.integers(0, p, size=m, dtype=np.int64)
    r = int(lane.basis.shape[0])
    if r == 0:
        return w
    starts = constraints.indptr[lane.basis]
    ends = constraints.indptr[lane.basis + 1]
    lengths = ends - starts
    take = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    entries = np.arange(int(lengths.sum()), dtype=np.int64) + take
    atoms = constraints.indices[entries].astype(np.int64)
    local = np.repeat(np.arange(r, dtype=np.int64), lengths)
    vals = constraints.values(p)[entries] if constraints.weighted else None
    # a row sums at most m terms, an atom at most r
    mw = _bincount_mod(local, w[atoms] if vals is None else w[atoms] * vals % p, r, p, m)
    y = modp.matmul(lane.k_inv, mw.reshape(r, 1), p).reshape(r)
    z = _bincount_mod(atoms, y[local] if vals is None else y[local] * vals % p, m, p, r)
    return (w - lane.d * z % p) % p


def row_sums(
    indptr: Int64Array,
    indices: Int32Array,
    v: Int64Array,
    p: int,
    values: Int64Array | None = None,
) -> Int64Array:
    """Σ v (times each entry's weight mod p, `values`, for weighted rows) over each CSR row,
    mod p."""
    n_rows = int(indptr.shape[0]) - 1
    if n_rows == 0:
        return np.zeros(0, dtype=np.int64)
    rows = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(indptr))
    # a row holds each atom once: at most max(indices) + 1 terms
    most = int(indices.max()) + 1 if indices.size else 0
    terms = v[indices.astype(np.int64)]
    if values is not None:
        terms = terms * values % p
    return _bincount_mod(rows, terms, n_rows, p, most)
