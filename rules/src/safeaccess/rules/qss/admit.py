"""Admitting the query sets of one output into a scope's state, all or nothing."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from safeaccess.rules.qss.constraints import (
    Constraints,
    LaneFailure,
    add_rows,
    null_vector,
    row_sums,
)
from safeaccess.rules.qss.partition import Int32Array, Refinement, extend, refine
from safeaccess.rules.qss.policy import AuditMode, AuditPolicy
from safeaccess.rules.qss.search import (
    Isolated,
    LaneVectors,
    determined_atoms,
    smallest_pair,
    smallest_triple,
)
from safeaccess.rules.qss.state import AuditState

_FALLBACK_WHY = {
    "atom_cap": "the partition would have more atoms than the span mode's cap",
    "small_atom_cap": "more atoms below k than the span mode's search of three-atom unions covers",
    "no_constraints": "this scope's state has no constraint record (admitted under atoms mode "
    "or past the atom cap)",
}


@dataclass(frozen=True)
class Admission:
    """The auditor's answer for one output."""

    admitted: bool
    state: AuditState | None
    reason: str | None
    smallest_isolated: int | None
    facts: dict[str, Any] = field(default_factory=dict)


class QuerySetError(ValueError):
    """A query-set array the auditor cannot use (wrong shape, type or values)."""


def _validated(state: AuditState, query_sets: Sequence[npt.NDArray[Any]]) -> list[Int32Array]:
    arrays: list[Int32Array] = []
    for i, raw in enumerate(query_sets):
        array = np.asarray(raw)
        if array.ndim != 1 or array.shape[0] != state.n_records:
            raise QuerySetError(
                f"query set {i}: expected a 1-D array of length {state.n_records} (one entry per "
                f"record id), got shape {array.shape}"
            )
        if not np.issubdtype(array.dtype, np.integer):
            raise QuerySetError(f"query set {i}: expected integer cell indices, got {array.dtype}")
        if array.dtype != np.int32:
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


def _atoms_rule(sizes: npt.NDArray[np.int64], k: int) -> Isolated | None:
    small = np.flatnonzero((sizes > 0) & (sizes < k))
    if small.size == 0:
        return None
    worst = int(small[np.argmin(sizes[small])])
    return Isolated(atoms=(worst,), size=int(sizes[worst]))


def admit(
    state: AuditState, query_sets: Sequence[npt.NDArray[Any]], policy: AuditPolicy
) -> Admission:
    """Admit every query set behind one output, or none. `query_sets[i][r]` is the cell
    (aggregate) record id r is behind in array i, or -1; each distinct cell is one released
    query set. Raises QuerySetError for malformed arrays (the state is never changed)."""
    arrays = _validated(state, query_sets)
    k = policy.k
    # the working copy of the atom array is made only when a later array needs the earlier
    # relabelling, or once the output is admitted: a refusal copies nothing of size n_records
    atom_of = state.atom_of
    copied = False
    sizes = state.sizes
    outside = state.outside
    refinements: list[Refinement] = []
    for i, array in enumerate(arrays):
        if i > 0:
            if not copied:
                atom_of, copied = atom_of.copy(), True
            refinements[-1].apply(atom_of)
        ref = refine(atom_of, sizes, outside, array)
        sizes, outside = ref.sizes, ref.outside
        refinements.append(ref)
    new_sets = sum(int(np.unique(ref.cell[ref.cell >= 0]).size) for ref in refinements)
    m_after = int(sizes.shape[0])
    facts: dict[str, Any] = {
        "mode": policy.mode.value,
        "k": k,
        "query_set_arrays": len(arrays),
        "new_query_sets": new_sets,
        "atoms_before": state.n_atoms,
        "atoms_after": m_after,
        "atoms_below_k_after": int(((sizes > 0) & (sizes < k)).sum()),
        "constraints_before": state.n_constraints,
        "query_sets_before": state.n_query_sets,
        "fallback": None,
    }

    fallback: str | None = None
    constraints = state.constraints
    if policy.mode is AuditMode.SPAN:
        if constraints is None:
            fallback = "no_constraints"
        elif m_after > policy.atom_cap:
            fallback = "atom_cap"

    isolated: Isolated | None = None
    new_constraints: Constraints | None = None
    if policy.mode is AuditMode.SPAN and fallback is None and constraints is not None:
        outcome = _span_audit(constraints, refinements, sizes, policy, facts)
        if isinstance(outcome, _Fallback):
            fallback = outcome.name
        elif isinstance(outcome, _Unverified):
            facts["rule"] = "span"
            facts["constraints_after"] = state.n_constraints
            return Admission(
                admitted=False,
                state=None,
                reason=f"span mode could not verify its exact computation ({outcome.what}); "
                "refused rather than released (a chance event: the next output is unaffected)",
                smallest_isolated=None,
                facts=facts,
            )
        else:
            isolated, new_constraints = outcome
    if policy.mode is AuditMode.ATOMS or fallback is not None:
        facts["rule"] = "atoms"
        facts["fallback"] = fallback
        isolated = _atoms_rule(sizes, k)
    else:
        facts["rule"] = "span"

    facts["smallest_atom"] = int(sizes.min()) if sizes.size else None
    if isolated is not None:
        facts["smallest_isolated"] = isolated.size
        facts["isolated_kind"] = isolated.kind
        reason = f"would isolate {isolated.size} record(s), fewer than k={k}, as {_kind(isolated)}"
        if fallback is not None:
            reason = f"span mode fell back to the atoms rule ({_FALLBACK_WHY[fallback]}); {reason}"
        facts["constraints_after"] = state.n_constraints
        return Admission(
            admitted=False,
            state=None,
            reason=reason,
            smallest_isolated=isolated.size,
            facts=facts,
        )
    if not copied:
        atom_of = atom_of.copy()
    if refinements:
        refinements[-1].apply(atom_of)
    new_state = AuditState(
        atom_of=atom_of,
        sizes=sizes.copy(),
        outside=outside,
        n_query_sets=state.n_query_sets + new_sets,
        constraints=new_constraints,
    )
    facts["constraints_after"] = new_state.n_constraints
    facts["smallest_isolated"] = None
    return Admission(
        admitted=True, state=new_state, reason=None, smallest_isolated=None, facts=facts
    )


def _kind(isolated: Isolated) -> str:
    if len(isolated.atoms) == 1:
        return "one atom (records sharing their membership in every released query set)"
    return (
        f"the union of {len(isolated.atoms)} atoms, whose total the released aggregates determine"
    )


@dataclass(frozen=True)
class _Fallback:
    name: str


@dataclass(frozen=True)
class _Unverified:
    what: str


def _span_audit(
    constraints: Constraints,
    refinements: list[Refinement],
    sizes: npt.NDArray[np.int64],
    policy: AuditPolicy,
    facts: dict[str, Any],
) -> tuple[Isolated | None, Constraints] | _Fallback | _Unverified:
    """Span mode: the smallest determined set below k (None) and the constraints to keep, or
    the name of the fallback to apply."""
    k = policy.k
    rng = np.random.default_rng(secrets.randbits(128))
    cells: list[Int32Array] = []
    for ref in refinements:
        cells = [extend(c, ref.parent) for c in cells]  # type: ignore[misc]
        cells.append(ref.cell)
        constraints = constraints.split(ref.parent, rng)
    try:
        candidate = add_rows(constraints, cells)
    except LaneFailure:
        facts["lane_failure"] = True
        return _Unverified("a lane's random weights made independent rows look singular")
    grown = candidate.constraints
    facts["new_independent"] = grown.n_rows - constraints.n_rows
    vectors: list[LaneVectors] = []
    in_any_basis = np.zeros(grown.n_rows, dtype=bool)
    for lane in grown.lanes:
        in_any_basis[lane.basis] = True
    verified = True
    for lane in grown.lanes:
        two = (null_vector(grown, lane, rng), null_vector(grown, lane, rng))
        for v in two:
            sums = row_sums(grown.indptr, grown.indices, v, lane.p)
            if np.any(sums[lane.basis] != 0):
                verified = False
            for row in candidate.dropped:
                if int(v[row].sum() % lane.p) != 0:
                    verified = False
        vectors.append(LaneVectors(p=lane.p, first=two[0], second=two[1]))
    if not verified:
        # a new row every lane called dependent is not in a lane's span: refuse, never guess
        facts["verification_failed"] = True
        return _Unverified("a new query set no lane kept is not in the span of the kept ones")
    determined = determined_atoms(vectors, grown.n_atoms)
    facts["determined_atoms"] = int(determined.sum())
    best: Isolated | None = None
    small_determined = np.flatnonzero(determined & (sizes < k))
    if small_determined.size:
        worst = int(small_determined[np.argmin(sizes[small_determined])])
        best = Isolated(atoms=(worst,), size=int(sizes[worst]))
    free = ~determined
    pair = smallest_pair(vectors, np.flatnonzero(free & (sizes <= k - 2)), sizes, k)
    if pair is not None and (best is None or pair.size < best.size):
        best = pair
    if best is None or best.size > 3:
        triple_candidates = np.flatnonzero(free & (sizes <= k - 3))
        facts["triple_candidates"] = int(triple_candidates.size)
        if triple_candidates.size > policy.small_atom_cap:
            return _Fallback("small_atom_cap")
        triple = smallest_triple(vectors, triple_candidates, sizes, k)
        if triple is not None and (best is None or triple.size < best.size):
            best = triple
    return best, grown
