"""Admitting the query sets of one output into a scope's state, all or nothing."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from threadpoolctl import ThreadpoolController

from safeaccess.rules.qss.certificate import (
    Certified,
    Determined,
    TooCostly,
    Verdict,
    carry_kept,
    decide_scratch,
)
from safeaccess.rules.qss.constraints import (
    CellKey,
    Constraints,
    Dependency,
    LaneFailure,
    add_rows,
    null_vector,
    row_sums,
)
from safeaccess.rules.qss.guard import Budget
from safeaccess.rules.qss.partition import CellArray, Int32Array, Refinement, extend, refine
from safeaccess.rules.qss.policy import AuditMode, AuditPolicy
from safeaccess.rules.qss.search import (
    Isolated,
    LaneVectors,
    determined_atoms,
    smallest_pair,
)
from safeaccess.rules.qss.state import AuditState

_FALLBACK_WHY = {
    "no_constraints": "this scope's state has no constraint record (it was admitted under "
    "atoms mode)",
}

#: Refusals for cost: named, never a silent switch to another rule (docs/qss.md measures them).
_COST_WHY = {
    "atom_cap": "the partition would have more atoms than the auditor's atom cap ({cap})",
    "search_nodes": "the exact search for a determined combination exceeded its budget of "
    "{nodes} branch(es)",
    # the operation count and the CPU guard (guard.py) end a search with the same answer: which
    # one ran out first is not the researcher's to see (the CPU clock depends on the load)
    "search_budget": "the exact search for a determined combination exceeded its budget of work",
}


@dataclass(frozen=True)
class Admission:
    """The auditor's answer for one output."""

    admitted: bool
    state: AuditState | None
    reason: str | None
    smallest_isolated: int | None
    facts: dict[str, Any] = field(default_factory=dict)
    #: (array, cell) of each row this admission adds to the constraints, in row order
    kept_keys: list[CellKey] = field(default_factory=list)
    #: the new query sets the records make combinations of kept ones (span mode): the caller
    #: refuses those the outputs' definitions do not imply (a data-revealed zero difference)
    dependencies: list[Dependency] = field(default_factory=list)


class QuerySetError(ValueError):
    """A query-set array the auditor cannot use (wrong shape, type or values)."""


@dataclass(frozen=True)
class WeightedSet:
    """Weighted rows over one partition of records (issue 41): a fit's design columns over the
    value groups of a few-valued regressor. `cells[r]` is record r's value group (-1 outside
    the fit); row j is Σ_c weights[j, c] · 1[group c], so what the fit releases (Σ_c
    f_j(v_c) · T_c for each design column j and every power of the outcome) is its span, not
    each group's total. The auditor refines its atoms by the groups and admits the rows with
    their weights (the floats the sandbox evaluated, each taken as its exact rational)."""

    cells: npt.NDArray[Any]
    weights: npt.NDArray[np.float64]  # (rows, groups)


#: Cell types an array keeps as it is (`outputs.cell_dtype`: a query set travels in the
#: narrowest of them its cell count allows; refining reads it without widening it first).
_CELL_TYPES = (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32))


def _validated(state: AuditState, query_sets: Sequence[npt.NDArray[Any]]) -> list[CellArray]:
    arrays: list[CellArray] = []
    for i, raw in enumerate(query_sets):
        array = np.asarray(raw)
        if array.ndim != 1 or array.shape[0] != state.n_records:
            raise QuerySetError(
                f"query set {i}: expected a 1-D array of length {state.n_records} (one entry per "
                f"record id), got shape {array.shape}"
            )
        if not np.issubdtype(array.dtype, np.integer):
            raise QuerySetError(f"query set {i}: expected integer cell indices, got {array.dtype}")
        if array.dtype not in _CELL_TYPES:
            if array.size and (int(array.min()) < -1 or int(array.max()) > 2**31 - 2):
                raise QuerySetError(
                    f"query set {i}: cell indices must be -1 (outside) or 0..2**31-2, found "
                    f"{int(array.min())}..{int(array.max())}"
                )
            array = array.astype(np.int32)
        elif array.size and int(array.min()) < -1:
            raise QuerySetError(
                f"query set {i}: cell indices must be -1 (outside) or >= 0, found {int(array.min())}"
            )
        arrays.append(array)
    return arrays


def _validated_weighted(
    state: AuditState, weighted: Sequence[WeightedSet], first: int
) -> tuple[list[CellArray], list[npt.NDArray[np.float64]]]:
    arrays = _validated(state, [w.cells for w in weighted])
    matrices = []
    for i, (ws, array) in enumerate(zip(weighted, arrays, strict=True)):
        w = np.asarray(ws.weights, dtype=np.float64)
        groups = int(array.max()) + 1 if array.size else 0
        if w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < groups:
            raise QuerySetError(
                f"query set {first + i}: expected weights of shape (rows, {groups} groups) or "
                f"wider, got {w.shape}"
            )
        if not bool(np.all(np.isfinite(w))):
            raise QuerySetError(f"query set {first + i}: a weight is not a finite number")
        matrices.append(w)
    return arrays, matrices


def _unsplit_cell(refinements: list[Refinement]) -> bool:
    """Whether some non-empty cell of the output is a union of whole atoms it found: every
    atom in it kept its id (below `n_before`) and no piece was split from it."""
    for ref in refinements:
        inside = ref.cell >= 0
        if not inside.any():
            continue
        ids = np.arange(ref.cell.shape[0])
        split = np.zeros(ref.cell.shape[0], dtype=bool)
        split[ref.parent] = True  # atoms that lost a piece
        changed = (ids >= ref.n_before) | split
        cells = ref.cell[inside]
        touched = np.bincount(cells, minlength=ref.n_cells)
        broken = np.bincount(cells, weights=changed[inside], minlength=ref.n_cells)
        if bool(np.any((touched > 0) & (broken == 0))):
            return True
    return False


def _atoms_rule(sizes: npt.NDArray[np.int64], k: int) -> Isolated | None:
    small = np.flatnonzero((sizes > 0) & (sizes < k))
    if small.size == 0:
        return None
    worst = int(small[np.argmin(sizes[small])])
    return Isolated(atoms=(worst,), size=int(sizes[worst]))


#: The BLAS libraries loaded with numpy. The auditor's matrices are small (R × R with R in the
#: hundreds, many products of a few columns): a multi-threaded BLAS spends more on waking and
#: syncing threads than on the product, and on a loaded machine it is several times slower (a
#: 50 × 400 by 400 × 100 product: 2 ms with two threads under load, 0.09 ms with one).
_BLAS = ThreadpoolController()
#: Set by `pin_one_blas_thread`: the process keeps one BLAS thread for good.
_pinned = False


def pin_one_blas_thread() -> None:
    """Limit this process's BLAS to one thread for good, so that `admit` need not limit it at
    each call: setting and restoring the limit queries every loaded BLAS library twice, about
    0.1 ms per admission (measured). For the server: its jobs compute in the sandbox's
    processes, and its own BLAS work (the auditor's, the synthesiser's nearest rows in
    `synthetic/cells.py`) runs single-threaded anyway."""
    global _pinned
    _BLAS.limit(limits=1, user_api="blas")  # kept: never restored
    _pinned = True


def admit(
    state: AuditState,
    query_sets: Sequence[npt.NDArray[Any]],
    policy: AuditPolicy,
    weighted: Sequence[WeightedSet] = (),
) -> Admission:
    """Admit every query set behind one output, or none. `query_sets[i][r]` is the cell
    (aggregate) record id r is behind in array i, or -1; each distinct cell is one released
    query set. `weighted` adds weighted rows (`WeightedSet`), numbered after the arrays:
    weighted set i is array len(query_sets) + i, its row j that array's cell j (in
    `kept_keys` and the dependencies). Raises QuerySetError for malformed arrays (the state
    is never changed)."""
    if _pinned:
        return _admit(state, query_sets, policy, weighted)
    # one BLAS thread while auditing (the limit is process-wide: another thread's products run
    # single-threaded meanwhile, which changes their speed, never their result)
    with _BLAS.limit(limits=1, user_api="blas"):
        return _admit(state, query_sets, policy, weighted)


def _admit(
    state: AuditState,
    query_sets: Sequence[npt.NDArray[Any]],
    policy: AuditPolicy,
    weighted: Sequence[WeightedSet] = (),
) -> Admission:
    plain = _validated(state, query_sets)
    group_arrays, matrices = _validated_weighted(state, weighted, len(plain))
    # the weighted sets' groups refine the atoms like any array (in atoms mode, and without
    # constraints, the atoms rule then holds every value group to k: the strict rule there)
    arrays = plain + group_arrays
    k = policy.k
    # the working copy of the atom array is made only when a later array needs the earlier
    # relabelling, or once the output is admitted: a refusal copies nothing of size n_records
    atom_of = state.atom_of
    owned = False  # whether atom_of is this admission's own array (never the state's)
    sizes = state.sizes
    outside = state.outside
    refinements: list[Refinement] = []
    for i, array in enumerate(arrays):
        if i > 0:
            atom_of, owned = refinements[-1].applied(atom_of, owned=owned)
        ref = refine(atom_of, sizes, outside, array)
        sizes, outside = ref.sizes, ref.outside
        refinements.append(ref)
    # distinct cells of each array (a count per cell, not a sort of every atom)
    new_sets = sum(
        int(np.count_nonzero(np.bincount(ref.cell[ref.cell >= 0])))
        for ref in refinements[: len(plain)]
    ) + sum(int(w.shape[0]) for w in matrices)
    m_after = int(sizes.shape[0])
    facts: dict[str, Any] = {
        "mode": policy.mode.value,
        "k": k,
        "query_set_arrays": len(arrays),
        "weighted_rows": sum(int(w.shape[0]) for w in matrices),
        "new_query_sets": new_sets,
        "atoms_before": state.n_atoms,
        "atoms_after": m_after,
        "atoms_below_k_after": int(((sizes > 0) & (sizes < k)).sum()),
        "constraints_before": state.n_constraints,
        "query_sets_before": state.n_query_sets,
        "fallback": None,
    }

    constraints = state.constraints
    fallback = "no_constraints" if policy.mode is AuditMode.SPAN and constraints is None else None
    facts["origin"] = state.n_query_sets

    def refused(reason: str, isolated: Isolated | None = None) -> Admission:
        facts["constraints_after"] = state.n_constraints
        if isolated is not None:
            facts["smallest_isolated"] = isolated.size
            facts["isolated_kind"] = isolated.kind
        return Admission(
            admitted=False,
            state=None,
            reason=reason,
            smallest_isolated=None if isolated is None else isolated.size,
            facts=facts,
        )

    isolated: Isolated | None = None
    new_constraints: Constraints | None = None
    kept_keys: list[CellKey] = []
    dependencies: list[Dependency] = []
    if policy.mode is AuditMode.ATOMS and constraints is not None:
        # The atoms rule, on top of the span audit below: the state keeps its constraints and
        # the admission its dependencies, so a query set the records alone make a repeat is
        # refused like a small atom (the server's data-revealed-zero check) and a refusal is
        # no oracle in this mode either.
        facts["rule"] = "atoms"
        isolated = _atoms_rule(sizes, k)
        if isolated is not None:
            facts["smallest_atom"] = int(sizes.min())
            return refused(
                f"would isolate {isolated.size} record(s), fewer than k={k}, as {_kind(isolated)}",
                isolated,
            )
    if constraints is not None:
        facts.setdefault("rule", "span")
        if m_after > policy.atom_cap:
            facts["cost"] = "atom_cap"
            return refused("refused for cost: " + _COST_WHY["atom_cap"].format(cap=policy.atom_cap))
        outcome = _span_audit(
            constraints, refinements, sizes, policy, facts, state.n_query_sets, matrices
        )
        if isinstance(outcome, _Unverified):
            return refused(
                f"span mode could not verify its exact computation ({outcome.what}); "
                "refused rather than released (a chance event: the next output is unaffected)"
            )
        if isinstance(outcome, _Costly):
            cost = "search_nodes" if outcome.limit == "nodes" else "search_budget"
            facts["cost"] = cost
            return refused("refused for cost: " + _COST_WHY[cost].format(nodes=policy.search_nodes))
        isolated, new_constraints, kept_keys, dependencies = outcome
    else:
        facts["rule"] = "atoms"
        facts["fallback"] = fallback
        isolated = _atoms_rule(sizes, k)
        if isolated is None and _unsplit_cell(refinements):
            # A state without constraints (admitted under atoms mode before it kept them)
            # cannot tell a repeat from a zero only the records reveal; releasing a cell that
            # splits no atom while refusing the one that isolates a record would make each
            # refusal an oracle, so both are refused.
            facts["unsplit_cell"] = True
            return refused(
                "this scope's state has no constraint record (it was admitted under atoms mode "
                "before constraints were kept), so a query set that is a union of earlier atoms "
                "may be a zero only the records reveal: refused like a small atom so that the "
                "refusal is no oracle"
            )

    facts["smallest_atom"] = int(sizes.min()) if sizes.size else None
    if isolated is not None:
        reason = f"would isolate {isolated.size} record(s), fewer than k={k}, as {_kind(isolated)}"
        if fallback is not None:
            reason = f"span mode applied the atoms rule ({_FALLBACK_WHY[fallback]}); {reason}"
        return refused(reason, isolated)
    if refinements:
        # the new state may share the old one's read-only array when nothing split
        atom_of, owned = refinements[-1].applied(atom_of, owned=owned)
    elif not owned:
        atom_of = atom_of.copy()
    new_state = AuditState(
        atom_of=atom_of,
        sizes=sizes.copy(),
        outside=outside,
        n_query_sets=state.n_query_sets + new_sets,
        constraints=new_constraints,
    )
    facts["constraints_after"] = new_state.n_constraints
    facts["smallest_isolated"] = None
    facts["dependencies"] = len(dependencies)
    return Admission(
        admitted=True,
        state=new_state,
        reason=None,
        smallest_isolated=None,
        facts=facts,
        kept_keys=kept_keys,
        dependencies=dependencies,
    )


def _kind(isolated: Isolated) -> str:
    if len(isolated.atoms) == 1:
        return "one atom (records sharing their membership in every released query set)"
    return (
        f"the union of {len(isolated.atoms)} atoms, whose total the released aggregates determine"
    )


@dataclass(frozen=True)
class _Unverified:
    what: str


@dataclass(frozen=True)
class _Costly:
    nodes: int
    limit: str


def _span_audit(
    constraints: Constraints,
    refinements: list[Refinement],
    sizes: npt.NDArray[np.int64],
    policy: AuditPolicy,
    facts: dict[str, Any],
    origin: int,
    matrices: Sequence[npt.NDArray[np.float64]] = (),
) -> tuple[Isolated | None, Constraints, list[CellKey], list[Dependency]] | _Unverified | _Costly:
    """Span mode: a determined combination below k (None when there is none) and the
    constraints to keep, decided exactly (see certificate.py). The last len(`matrices`)
    refinements are weighted sets' groups: each gives its weighted rows instead of one row per
    group."""
    k = policy.k
    rng = np.random.default_rng(secrets.randbits(128))
    kept, n_old_rows, n_old_atoms = constraints.kept, constraints.n_rows, constraints.n_atoms
    ancestor = np.arange(constraints.n_atoms, dtype=np.int64)  # each atom's atom before this output
    n_plain = len(refinements) - len(matrices)
    cells: list[Int32Array] = []
    weights: list[npt.NDArray[np.float64] | None] = []
    # each array given to add_rows: None for a 0/1 array (its keys are its own), else the
    # (array, row) of the weighted set and row it is
    source: list[CellKey | None] = []
    for i, ref in enumerate(refinements):
        cells = [extend(c, ref.parent) for c in cells]  # type: ignore[misc]
        weights = [None if w is None else extend(w, ref.parent) for w in weights]  # type: ignore[misc]
        if i < n_plain:
            cells.append(ref.cell)
            weights.append(None)
            source.append(None)
        else:
            matrix = matrices[i - n_plain]
            inside = ref.cell >= 0
            for j in range(int(matrix.shape[0])):
                w = np.zeros(ref.cell.shape[0], dtype=np.float64)
                w[inside] = matrix[j, ref.cell[inside]]
                # a row holds the atoms of its nonzero weights (a zero weight is no entry)
                cells.append(np.where(w != 0, 0, -1).astype(np.int32))
                weights.append(w)
                source.append((i, j))
        constraints = constraints.split(ref.parent, rng)
        ancestor = extend(ancestor, ref.parent)  # type: ignore[assignment]

    def key_of(key: CellKey) -> CellKey:
        found = source[key[0]]
        return key if found is None else found

    try:
        candidate = add_rows(
            constraints, cells, origin, weights if any(w is not None for w in weights) else None
        )
        candidate = replace(
            candidate,
            kept_keys=[key_of(key) for key in candidate.kept_keys],
            dependencies=[replace(d, key=key_of(d.key)) for d in candidate.dependencies],
        )
    except LaneFailure:
        facts["lane_failure"] = True
        return _Unverified("a lane's random weights made independent rows look singular")
    grown = candidate.constraints
    facts["new_independent"] = grown.n_rows - constraints.n_rows
    facts["rank"] = grown.n_rows
    if candidate.unverified:
        # a new row no lane kept is not the combination its lanes found: refuse, never guess
        facts["verification_failed"] = True
        return _Unverified("a new query set no lane kept is not in the span of the kept ones")
    # The certificate needs a prime in which every kept row is independent: then
    # rank_p(A) = rank_Q(A) and a certificate found mod p holds over the rationals.
    full = [lane for lane in grown.lanes if int(lane.basis.shape[0]) == grown.n_rows]
    if not full:
        return _Unverified("no lane holds every admitted row independent")
    # Fast path: the kept certificate carried over this output proves that nothing small is
    # determined, so the null vectors (whose only use is a fast refusal) are not needed.
    carried = carry_kept(
        kept,
        grown.indptr,
        grown.indices,
        sizes,
        k,
        n_old_rows,
        ancestor,
        n_old_atoms,
        grown.data,
    )
    verdict: Verdict
    if carried is not None:
        verdict, kept = carried
    else:
        early = _fast_refusal(grown, sizes, k, rng, facts)
        if isinstance(early, _Unverified):
            return early
        if early is not None:
            return early, grown, [], []
        verdict, kept = decide_scratch(
            grown.indptr,
            grown.indices,
            sizes,
            k,
            full[0].p,
            policy.search_nodes,
            Budget(),
            grown.data,
        )
    facts["certificate"] = {
        "verdict": type(verdict).__name__.lower(),
        "nodes": verdict.nodes,
        **(
            {
                "kept": verdict.kept,
                "sets": verdict.sets,
                "atoms_used": verdict.atoms_used,
                "quotient_dim": verdict.quotient_dim,
                "big_rank": verdict.big_rank,
            }
            if isinstance(verdict, Certified)
            else {}
        ),
    }
    if isinstance(verdict, TooCostly):
        facts["certificate"].update(limit=verdict.limit, operations=verdict.operations)
        return _Costly(verdict.nodes, verdict.limit)
    if isinstance(verdict, Determined):
        found = Isolated(atoms=verdict.atoms, size=verdict.records)
        facts["conflicts_with"] = sorted(
            {int(grown.origin[r]) for r in verdict.rows if int(grown.origin[r]) != origin}
        )
        return found, grown, [], []
    return None, replace(grown, kept=kept), candidate.kept_keys, candidate.dependencies


def _fast_refusal(
    grown: Constraints,
    sizes: npt.NDArray[np.int64],
    k: int,
    rng: np.random.Generator,
    facts: dict[str, Any],
) -> Isolated | _Unverified | None:
    """A determined small atom or pair, found cheaply from two random null vectors per lane (a
    chance zero can only refuse); None when there is none (the certificate decides the rest)."""
    vectors: list[LaneVectors] = []
    for lane in grown.lanes:
        two = (null_vector(grown, lane, rng), null_vector(grown, lane, rng))
        for v in two:
            values = grown.values(lane.p) if grown.weighted else None
            sums = row_sums(grown.indptr, grown.indices, v, lane.p, values)
            if np.any(sums[lane.basis] != 0):
                facts["verification_failed"] = True
                return _Unverified("a lane's null vector is not orthogonal to its rows")
        vectors.append(LaneVectors(p=lane.p, first=two[0], second=two[1]))
    determined = determined_atoms(vectors, grown.n_atoms)
    facts["determined_atoms"] = int(determined.sum())
    small_determined = np.flatnonzero(determined & (sizes < k))
    if small_determined.size:
        worst = int(small_determined[np.argmin(sizes[small_determined])])
        return _conflict(Isolated(atoms=(worst,), size=int(sizes[worst])), grown, facts)
    pair = smallest_pair(vectors, np.flatnonzero(~determined & (sizes <= k - 2)), sizes, k)
    if pair is not None:
        return _conflict(pair, grown, facts)
    return None


def _conflict(isolated: Isolated, grown: Constraints, facts: dict[str, Any]) -> Isolated:
    """Record, for the controller, which earlier admissions the isolated atoms' rows came from
    (the rows that contain them; the researcher is never shown this)."""
    atoms = np.asarray(isolated.atoms, dtype=np.int64)
    rows = np.repeat(np.arange(grown.n_rows), np.diff(grown.indptr))
    hit = np.isin(grown.indices, atoms)
    origins = {int(o) for o in grown.origin[np.unique(rows[hit])]}
    facts["conflicts_with"] = sorted(o for o in origins if o >= 0 and o != int(facts["origin"]))
    return isolated
