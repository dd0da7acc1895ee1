"""The span criterion decided exactly: a rank certificate, and a bounded exact search behind it.

A is the R × m matrix of the admitted query sets (independent rows) over atoms; nₐ is atom a's
record count. A combination c of the atoms' aggregates is revealed iff c ∈ rowspace(A). The
criterion: **refuse iff some nonzero c ∈ rowspace(A) is supported on atoms holding fewer than k
records in all** — any signs, any number of atoms, and every power sum at once (the same row
space acts on y, y², y³, …). By the cocircuit lemma, such a c supported inside a set S exists iff
the columns outside S have rank < R.

Certificate (`../shared/notes/qss-certificate.md`): Big = atoms with nₐ ≥ k; a support S with
fewer than k records avoids Big. If T₁ … T_t are pairwise disjoint sets of small atoms with each
Big ∪ Tᵢ of rank R, S must meet every Tᵢ (else the columns outside S hold Big ∪ Tᵢ), which costs
Σᵢ min_{a∈Tᵢ} nₐ records; once that sum reaches k no small combination is determined. The sets
are built greedily, from atoms in random order, in the quotient of GF(p)^R by the span of Big.

When the packing stops short, the search branches exactly: S must contain one atom of some Tᵢ;
each branch removes that atom and packs again with the budget left. A branch whose remaining
atoms (with Big) no longer span has found a determined combination supported on the removed
atoms. The search visits at most `max_nodes` branches; past that the output is refused for cost,
under its own name.

Exactness: ranks are computed exactly over GF(p) for the prime of a lane in which all R rows are
independent, so rank_p(A) = R = rank_Q(A). A set spanning mod p spans over Q (rank_Q ≥ rank_p),
so a certificate is never wrong. A rank that drops only mod p can make the search report a
combination that does not exist over Q: an error that only refuses (probability below
R·log₂R / 2^30 per refusal), never one that releases.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from safeaccess.rules.qss import kept as kept_sets
from safeaccess.rules.qss import modp
from safeaccess.rules.qss.guard import Budget, Exhausted
from safeaccess.rules.qss.kept import KeptSets

Int64Array = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]
FloatArray = npt.NDArray[np.float64]

#: Columns reduced at a time against a completing set's basis.
_CHUNK = 48
#: Atoms projected into the quotient at a time (most project to zero and are dropped).
_GROW = 4096
#: Branches of the exact search before the output is refused for cost.
MAX_NODES = 400


@dataclass(frozen=True)
class Certified:
    """No small combination is determined. `sets` disjoint completing sets were needed."""

    sets: int
    atoms_used: int
    quotient_dim: int
    big_rank: int
    nodes: int
    kept: bool = False  # decided by the sets kept from the previous admission


@dataclass(frozen=True)
class Determined:
    """A nonzero combination of released aggregates supported on `atoms` (fewer than k records
    in all) is determined. `rows` are the admitted rows (local indices) it combines."""

    atoms: tuple[int, ...]
    records: int
    rows: tuple[int, ...]
    nodes: int


@dataclass(frozen=True)
class TooCostly:
    """The exact search exceeded its budget (`limit`: its branches, its operations or its CPU
    time, `guard.py`): refused for cost, never released."""

    nodes: int
    quotient_dim: int
    limit: str = "nodes"
    operations: int = 0


Verdict = Certified | Determined | TooCostly


@dataclass
class _Quotient:
    """Small atoms' columns in the quotient of GF(p)^R by the span of the big atoms' columns,
    computed lazily in `order` and kept only when nonzero: an atom whose
    column lies in the big atoms' span is never in the support of a combination that avoids
    Big, so it is dropped for good. `atoms[u]` is the atom of useful index u."""

    csc: sp.csc_matrix
    big: modp.ColumnBasis
    free_rows: Int64Array
    order: Int64Array
    p: int
    zero_one: bool = True  # every entry of the rows is 1 (no weighted row)
    scanned: int = 0
    count: int = 0
    atoms: Int64Array = field(default_factory=lambda: np.zeros(0, np.int64))
    # int32: values are below p < 2**31, and this cache is the certificate's largest array
    cache: Int32Array = field(default_factory=lambda: np.zeros((0, 0), np.int32))

    @property
    def dim(self) -> int:
        return int(self.free_rows.shape[0])

    @property
    def exhausted(self) -> bool:
        return self.scanned >= int(self.order.shape[0])

    def grow(self) -> None:
        """Project the next chunk of `order` and keep its nonzero columns."""
        new = self.order[self.scanned : self.scanned + _GROW]
        self.scanned += int(new.shape[0])
        z = self.big.reduce(_dense(self.csc, new), zero_one=self.zero_one)[self.free_rows, :]
        keep = np.flatnonzero(z.any(axis=0))
        if keep.size == 0:
            return
        need = self.count + int(keep.size)
        if need > self.cache.shape[1]:
            size = max(need, self.cache.shape[1] + self.cache.shape[1] // 2, _GROW)
            grown = np.zeros((self.dim, size), np.int32)
            atoms = np.zeros(size, np.int64)
            if self.count:
                grown[:, : self.count] = self.cache[:, : self.count]
                atoms[: self.count] = self.atoms[: self.count]
            self.cache = grown
            self.atoms = atoms
        self.cache[:, self.count : need] = z[:, keep]
        self.atoms[self.count : need] = new[keep]
        self.count = need

    def columns(self, useful: Int64Array) -> Int64Array:
        return self.cache[:, useful].astype(np.int64)

    def lift(self, u: Int64Array) -> Int64Array:
        """The y in GF(p)^R that acts on every column x as u acts on x's quotient image."""
        n = int(self.csc.shape[0])
        y = np.zeros(n, np.int64)
        y[self.free_rows] = u
        if self.big.rank:
            # z(x) = (x − V x[P])[Q]  ⇒  uᵀz(x) = uᵀx[Q] − (V[Q,:]ᵀu)ᵀ x[P]
            v_free = self.big.vectors[self.free_rows, :]
            back = modp.matmul(v_free.T.copy(), u.reshape(-1, 1), self.p).reshape(-1)
            y[self.big.pivots] = (-back) % self.p
        return y


def _dense(csc: sp.csc_matrix, atoms: Int64Array) -> Int64Array:
    return np.asarray(csc[:, atoms].toarray(), dtype=np.int64)


@dataclass
class _Packing:
    sets: list[Int64Array]  # useful indices of the quotient
    bound: float
    failed: modp.ColumnBasis | None  # the last set's basis when the atoms left did not complete it


def _pack_by_size(
    q: _Quotient, sizes: Int64Array, excluded: frozenset[int], budget: int, spend: Budget
) -> _Packing:
    """Greedy disjoint completing sets, one after the other, largest atoms first, until the sum
    of their smallest atoms reaches `budget` or the atoms left no longer complete a set: every
    useful atom is projected, but each set's smallest atom is as large as the greedy can make
    it, which is what the bound adds up."""
    d = q.dim
    used = np.zeros(int(q.order.shape[0]), dtype=bool)
    if excluded:
        used[list(excluded)] = True
    while not q.exhausted:
        q.grow()
    sequence = np.argsort(-sizes[q.atoms[: q.count]], kind="stable").astype(np.int64)
    sets: list[Int64Array] = []
    bound = 0.0
    while bound < budget:
        basis = modp.ColumnBasis(d, q.p)
        members: list[int] = []
        start = 0
        chunk = _CHUNK
        while basis.rank < d and start < q.count:
            stop = min(q.count, start + chunk)
            window = sequence[start:stop]
            useful = window[~used[window]]
            start = stop
            if useful.size == 0:
                continue
            spend.charge(int(useful.size), d, basis.rank)
            added = basis.insert(q.columns(useful))
            members.extend(int(x) for x in useful[added])
            # a batch that adds nothing says the span is nearly full: read further at a time
            chunk = _CHUNK if added else min(chunk * 2, _GROW)
        if basis.rank < d:
            return _Packing(sets, bound, failed=basis)
        chosen = np.asarray(members, dtype=np.int64)
        used[chosen] = True
        sets.append(chosen)
        bound += float(sizes[q.atoms[chosen]].min()) if chosen.size else float("inf")
    return _Packing(sets, bound, failed=None)


def _pack_first_fit(
    q: _Quotient, sizes: Int64Array, excluded: frozenset[int], budget: int, spend: Budget
) -> _Packing:
    """Disjoint completing sets filled side by side in one pass over the atoms (random order):
    each batch goes to the first set it extends, what is left to the next. An atom in the span
    of every set so far is in their spans for good (spans only grow), so it is never read again:
    the scan is shared by all the sets instead of repeated for each."""
    d = q.dim
    limit = max(1, budget)  # every atom holds a record: `budget` sets always suffice
    bases = [modp.ColumnBasis(d, q.p) for _ in range(limit)]
    members: list[list[int]] = [[] for _ in range(limit)]
    skip = np.zeros(int(q.order.shape[0]), dtype=bool)
    if excluded:
        skip[list(excluded)] = True
    start = 0

    def bound() -> float:
        return sum(
            float(sizes[q.atoms[np.asarray(m, dtype=np.int64)]].min()) if m else float("inf")
            for b, m in zip(bases, members, strict=True)
            if b.rank == d
        )

    while bound() < budget:
        if start >= q.count:
            if q.exhausted:
                break
            q.grow()
            continue
        stop = min(q.count, start + _GROW)
        pending = start + np.flatnonzero(~skip[start:stop])
        start = stop
        for basis, chosen in zip(bases, members, strict=True):
            if pending.size == 0:
                break
            if basis.rank == d:
                continue
            spend.charge(int(pending.size), d, basis.rank)
            added = basis.insert(q.columns(pending))
            if added:
                chosen.extend(int(x) for x in pending[added])
                pending = np.delete(pending, added)
    complete = [
        np.asarray(m, dtype=np.int64) for b, m in zip(bases, members, strict=True) if b.rank == d
    ]
    failed = bases[0] if bases[0].rank < d else None
    return _Packing(complete, bound(), failed=failed)


def _pack_by_capacity(
    q: _Quotient, sizes: Int64Array, excluded: frozenset[int], budget: int, spend: Budget
) -> _Packing:
    """Completing sets in which a small atom of n records may serve up to n sets (its
    capacity), one set after the other, each the greedy basis over the atoms in order of the
    capacity they have left (ties at random), until `budget` sets are complete or the atoms
    left with capacity no longer complete one. Each set counts 1 towards the bound.

    Sound: a support S that avoids Big meets every completing set, so
    Σ_{a∈S} nₐ ≥ Σ_{a∈S} #{i : a ∈ Tᵢ} = Σᵢ |S ∩ Tᵢ| ≥ the number of sets. This is the
    disjoint certificate of the note on records instead of atoms (an atom of n records is n
    parallel columns), and it certifies what the disjoint sets cannot: a released cell of
    exactly k records held by a few atoms is a cocircuit of weight k that every completing set
    must meet, so at most as many disjoint sets as it has atoms exist, while its records give
    k sets room."""
    d = q.dim
    while not q.exhausted:
        q.grow()
    atoms = q.atoms[: q.count]
    capacity = np.minimum(sizes[atoms], max(1, budget)).astype(np.int64)
    if excluded:
        capacity[list(excluded)] = 0
    ties = np.random.default_rng(secrets.randbits(64)).permutation(q.count)
    sets: list[Int64Array] = []
    while len(sets) < budget:
        live = np.flatnonzero(capacity > 0)
        # most capacity first: the greedy basis of largest total capacity spends the scarce
        # atoms (those of one record) last; random among equals (split siblings are parallel)
        sequence = live[np.lexsort((ties[live], -capacity[live]))]
        basis = modp.ColumnBasis(d, q.p)
        members: list[int] = []
        start = 0
        chunk = _CHUNK
        while basis.rank < d and start < sequence.shape[0]:
            window = sequence[start : start + chunk]
            start += int(window.shape[0])
            spend.charge(int(window.size), d, basis.rank)
            added = basis.insert(q.columns(window))
            members.extend(int(x) for x in window[added])
            chunk = _CHUNK if added else min(chunk * 2, _GROW)
        if basis.rank < d:
            return _Packing(sets, float(len(sets)), failed=basis)
        chosen = np.asarray(members, dtype=np.int64)
        capacity[chosen] -= 1
        sets.append(chosen)
    return _Packing(sets, float(len(sets)), failed=None)


def _best_packing(
    q: _Quotient, sizes: Int64Array, excluded: frozenset[int], budget: int, spend: Budget
) -> _Packing:
    """The first-fit packing in random order; when that falls short, the largest-first one,
    then the one by records (`_pack_by_capacity`); the largest bound is kept."""
    fast = _pack_first_fit(q, sizes, excluded, budget, spend)
    if fast.bound >= budget or (not fast.sets and fast.failed is not None):
        return fast
    slow = _pack_by_size(q, sizes, excluded, budget, spend)
    best = slow if slow.bound > fast.bound else fast
    if best.bound >= budget:
        return best
    shared = _pack_by_capacity(q, sizes, excluded, budget, spend)
    return shared if shared.bound > best.bound else best


def decide(
    indptr: Int64Array,
    indices: Int32Array,
    n_atoms: int,
    sizes: Int64Array,
    k: int,
    p: int,
    max_nodes: int = MAX_NODES,
    spend: Budget | None = None,
    data: FloatArray | None = None,
) -> Verdict:
    """Decide the criterion for the CSR rows (independent mod p) over atoms of these sizes;
    `data`: each entry's weight when some row is weighted (None: every entry is 1).

    First in a fresh small prime (below 2**21, where matrix products are one exact float
    product, several times faster): a certificate found there is sound all the same, because a
    completing set of rank R mod any prime proves rank R over the rationals. Only when that
    attempt does not certify (a determined combination, or a rank that may have dropped mod the
    small prime) is the decision made again in p, whose verdict stands.

    Both attempts share one `spend` (`guard.Budget`): the search's operations and CPU time are
    bounded over the whole decision. A search that ran out of its budget in the small prime is
    refused for cost at once (the large prime would search the same atoms again, and a rank
    drop mod the small prime, the only thing it could undo, has probability below 2**-10)."""
    spend = spend if spend is not None else Budget()
    small_p = modp.random_prime(1 << 20, 1 << 21)
    fast = _decide(indptr, indices, n_atoms, sizes, k, small_p, max_nodes, spend, data)
    if isinstance(fast, Certified | TooCostly):
        return fast
    return _decide(indptr, indices, n_atoms, sizes, k, p, max_nodes, spend, data)


def carry_kept(
    kept: KeptSets | None,
    indptr: Int64Array,
    indices: Int32Array,
    sizes: Int64Array,
    k: int,
    n_old_rows: int,
    ancestor: Int64Array,
    n_old_atoms: int | None = None,
    data: FloatArray | None = None,
) -> tuple[Certified, KeptSets] | None:
    """The completing sets kept from the previous admission carried over this one's splits and
    rows (`kept.py`), when that certifies; None when it cannot (decide from scratch then). It
    never refuses: a kept family that certifies is a proof, anything else decides nothing.

    `n_old_rows`: the rows before this admission (the kept sets cover exactly those);
    `ancestor[a]`: the atom before this admission that atom a is a piece of; `n_old_atoms`: the
    atoms before it (counted from `ancestor` when not given)."""
    if kept is None or kept.n_rows != n_old_rows or kept.n_sets < k:
        return None
    n_rows = int(indptr.shape[0]) - 1
    n_atoms = int(sizes.shape[0])
    if n_old_atoms is None:  # the atoms that are their own ancestor
        n_old_atoms = n_atoms - int(np.count_nonzero(ancestor != np.arange(n_atoms)))
    swapped, holes = kept_sets.substitute(kept, ancestor, n_old_atoms, sizes, k)
    need = (n_rows - n_old_rows) * kept.n_sets + sum(len(h) for h in holes)
    fresh = np.arange(n_old_atoms, n_atoms, dtype=np.int64)
    # weighted rows: the entries' weights mod the sets' prime (the columns read carry them)
    values = None if data is None else modp.float_mod(data, kept.p)

    def supply() -> Iterator[tuple[Int64Array, kept_sets.FloatArray]]:
        # ordered only when read: an output that adds no row and leaves no hole reads none
        order = kept_sets.candidate_order(indptr, indices, sizes, k, n_old_rows, n_rows, fresh)
        return kept_sets.batches(
            indptr, indices, n_atoms, n_rows, order, size=2 * need + 64, values=values
        )()

    carried = kept_sets.extend(
        swapped, indptr, indices, n_rows, sizes, k, supply, holes, values=values
    )
    if carried is None or not carried.certifies(sizes, k):
        return None
    return _certified_by(carried, sizes, k, n_rows, kept=True), carried


def _certified_by(
    sets: KeptSets, sizes: Int64Array, k: int, n_rows: int, *, kept: bool
) -> Certified:
    """The certificate that completing sets which certify make (no search: `nodes` 0)."""
    big = int((sizes[sets.cols[0]] >= k).sum()) if sets.cols else 0
    return Certified(
        sets=sets.n_sets,
        atoms_used=sets.small_members(sizes, k),
        quotient_dim=n_rows - big,
        big_rank=big,
        nodes=0,
        kept=kept,
    )


def decide_scratch(
    indptr: Int64Array,
    indices: Int32Array,
    sizes: Int64Array,
    k: int,
    p: int,
    max_nodes: int,
    spend: Budget | None = None,
    data: FloatArray | None = None,
) -> tuple[Verdict, KeptSets | None]:
    """Decide from scratch, and keep new completing sets for the next admission. The kept sets
    are built first (`kept.build`): when they certify they are the proof, and the exact
    `decide` (packing and branch-and-bound) runs only when they do not. `data`: the entries'
    weights when some row is weighted (the kept sets then hold weighted columns)."""
    built = kept_sets.build(indptr, indices, sizes, k, k, data)
    if built is not None and built.certifies(sizes, k):
        return _certified_by(built, sizes, k, int(indptr.shape[0]) - 1, kept=False), built
    verdict = decide(indptr, indices, int(sizes.shape[0]), sizes, k, p, max_nodes, spend, data)
    if isinstance(verdict, Certified):
        return verdict, kept_sets.build(indptr, indices, sizes, k, k, data)
    return verdict, None


def decide_kept(
    kept: KeptSets | None,
    indptr: Int64Array,
    indices: Int32Array,
    sizes: Int64Array,
    k: int,
    p: int,
    max_nodes: int,
    n_old_rows: int,
    ancestor: Int64Array,
) -> tuple[Verdict, KeptSets | None]:
    """Decide with the completing sets kept from the previous admission when they can be
    carried over (`carry_kept`); otherwise from scratch (`decide_scratch`)."""
    carried = carry_kept(kept, indptr, indices, sizes, k, n_old_rows, ancestor)
    if carried is not None:
        return carried
    return decide_scratch(indptr, indices, sizes, k, p, max_nodes)


def _decide(
    indptr: Int64Array,
    indices: Int32Array,
    n_atoms: int,
    sizes: Int64Array,
    k: int,
    p: int,
    max_nodes: int,
    spend: Budget,
    weights: FloatArray | None = None,
) -> Verdict:
    n_rows = int(indptr.shape[0]) - 1
    if n_rows == 0:
        return Certified(sets=0, atoms_used=0, quotient_dim=0, big_rank=0, nodes=0)
    # weighted entries as their exact rationals mod p (below 2**31: exact in float64)
    data = (
        np.ones(indices.shape[0], dtype=np.float64)
        if weights is None
        else modp.float_mod(weights, p).astype(np.float64)
    )
    csc = sp.csr_matrix((data, indices, indptr), shape=(n_rows, n_atoms)).tocsc()
    big_atoms = np.flatnonzero(sizes >= k)
    big = modp.ColumnBasis(n_rows, p)
    for start in range(0, int(big_atoms.shape[0]), _CHUNK):
        spend.check()
        big.insert(_dense(csc, big_atoms[start : start + _CHUNK]))
        if big.rank == n_rows:
            break
    free = np.ones(n_rows, dtype=bool)
    free[big.pivots] = False
    small = np.flatnonzero((sizes > 0) & (sizes < k))
    # random order: atoms taken in size order (or neighbouring ids, split from one parent) are
    # nearly parallel, and the scan wastes itself on dependent columns; random atoms are generic
    order = small[np.random.default_rng(secrets.randbits(64)).permutation(small.shape[0])]
    order = order.astype(np.int64)
    q = _Quotient(
        csc=csc,
        big=big,
        free_rows=np.flatnonzero(free).astype(np.int64),
        order=order,
        p=p,
        zero_one=weights is None,
    )
    if q.dim == 0:
        return Certified(sets=0, atoms_used=0, quotient_dim=0, big_rank=big.rank, nodes=0)

    nodes = 0
    seen: set[frozenset[int]] = set()

    def search(
        removed: tuple[int, ...], weight: int
    ) -> tuple[tuple[int, ...], modp.ColumnBasis] | None:
        nonlocal nodes
        nodes += 1
        if nodes > max_nodes:
            raise _Budget
        packing = _best_packing(q, sizes, frozenset(removed), k - weight, spend)
        if not packing.sets and packing.failed is not None:
            return removed, packing.failed  # the atoms left do not span: found
        if packing.bound >= k - weight:
            return None
        if not packing.sets:
            return None
        # S must meet every completing set: branch on the atoms of the one with fewest options
        budget = k - weight
        options = [s[sizes[q.atoms[s]] < budget] for s in packing.sets]
        branch = min(options, key=lambda s: int(s.shape[0]))
        for useful in branch[np.argsort(sizes[q.atoms[branch]], kind="stable")]:
            key = frozenset((*removed, int(useful)))
            if key in seen:
                continue
            seen.add(key)
            found = search((*removed, int(useful)), weight + int(sizes[q.atoms[useful]]))
            if found is not None:
                return found
        return None

    try:
        root = _best_packing(q, sizes, frozenset(), k, spend)
        if root.bound >= k:
            return Certified(
                sets=len(root.sets),
                atoms_used=int(sum(s.shape[0] for s in root.sets)),
                quotient_dim=q.dim,
                big_rank=big.rank,
                nodes=1,
            )
        spend.searching = True
        found = search((), 0)
    except _Budget:
        return TooCostly(nodes=nodes, quotient_dim=q.dim, limit="nodes", operations=spend.used)
    except Exhausted as exc:
        return TooCostly(nodes=nodes, quotient_dim=q.dim, limit=exc.limit, operations=spend.used)
    if found is None:
        return Certified(
            sets=len(root.sets),
            atoms_used=int(sum(s.shape[0] for s in root.sets)),
            quotient_dim=q.dim,
            big_rank=big.rank,
            nodes=nodes,
        )
    removed, basis = found
    u = basis.annihilator()
    assert u is not None  # the basis did not span
    y = q.lift(u)
    atoms = q.atoms[np.asarray(removed, dtype=np.int64)] if removed else np.empty(0, np.int64)
    c = (
        modp.matmul(_dense(csc, atoms).T.copy(), y.reshape(-1, 1), p).reshape(-1)
        if atoms.size
        else atoms
    )
    support = atoms[c != 0] if atoms.size else atoms
    return Determined(
        atoms=tuple(int(a) for a in np.sort(support)),
        records=int(sizes[support].sum()),
        rows=tuple(int(r) for r in np.flatnonzero(y)),
        nodes=nodes,
    )


class _Budget(Exception):
    pass
