"""Classic tracker and differencing attacks on small synthetic data, and ordinary research that
span mode must let through.

Each attack is a sequence of outputs whose query sets, all released, would give a target's exact
value; each test checks with exact rational algebra (the brute-force oracle, not the auditor) that
the attack works when nothing is audited, then that the auditor refuses at the output that would
complete it, and that what it did admit determines nothing below k.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from _qss_oracle import RowSpace, atoms_of, query_sets_of, smallest_determined_up_to_three

from safeaccess.rules.qss import AuditMode, AuditPolicy, AuditState, admit

K = 10
N = 120
rng = np.random.default_rng(20260)
OCCUPATION = rng.integers(0, 3, N)
FEMALE = rng.integers(0, 2, N).astype(bool)
TARGET = 17  # the one person meeting condition C
FEMALE[TARGET] = False


def cells(values: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
    """A table's query-set array: each record's cell, -1 outside the filter."""
    out = values.astype(np.int32).copy()
    if where is not None:
        out[~where] = -1
    return out


def flt(where: np.ndarray) -> np.ndarray:
    return np.where(where, 0, -1).astype(np.int32)


def ids(members: Sequence[int] | range, n: int = N) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[list(members)] = True
    return out


def determined(n: int, sets: list[frozenset[int]], records: set[int]) -> bool:
    """Whether the sum over `records` follows from the released query sets (exact rationals)."""
    atoms = atoms_of(n, sets)
    if any(0 < len(a & records) < len(a) for a in atoms):
        return False  # not a union of atoms: not even expressible
    indicator = [1 if a <= records else 0 for a in atoms]
    return RowSpace(sets, atoms).contains(indicator)


def run(
    outputs: list[list[np.ndarray]],
    mode: AuditMode,
    n: int = N,
    grow_before: dict[int, int] | None = None,
) -> tuple[list[bool], list[frozenset[int]], AuditState]:
    """Admit the outputs in order; returns which were admitted and the admitted query sets."""
    state = AuditState.empty(n if not grow_before else min(grow_before.values()))
    policy = AuditPolicy(mode=mode, k=K)
    admitted: list[bool] = []
    released: list[frozenset[int]] = []
    for step, arrays in enumerate(outputs):
        if grow_before and step in grow_before:
            state = state.grow(grow_before[step])
        result = admit(state, arrays, policy)
        admitted.append(result.admitted)
        if result.admitted:
            assert result.state is not None
            state = result.state
            released += query_sets_of(arrays)
        else:
            assert result.reason and str(result.smallest_isolated) in result.reason
    return admitted, released, state


def nothing_small_determined(n: int, released: list[frozenset[int]]) -> bool:
    """No union of up to three atoms with fewer than K records is determined."""
    return smallest_determined_up_to_three(n, released, K) is None


MODES = list(AuditMode)


def general_tracker() -> list[list[np.ndarray]]:
    c = ids([TARGET])
    return [
        [cells(OCCUPATION, c | FEMALE)],
        [cells(OCCUPATION, c | ~FEMALE)],
        [cells(OCCUPATION)],
    ]


@pytest.mark.parametrize("mode", MODES)
def test_general_tracker(mode: AuditMode) -> None:
    outputs = general_tracker()
    everything = [s for arrays in outputs for s in query_sets_of(arrays)]
    assert determined(N, everything, {TARGET}), "the attack must work unaudited"
    admitted, released, _ = run(outputs, mode)
    assert admitted == ([True, True, False] if mode is AuditMode.SPAN else [True, False, True])
    assert not determined(N, released, {TARGET})
    assert nothing_small_determined(N, released)


@pytest.mark.parametrize("mode", MODES)
def test_individual_tracker(mode: AuditMode) -> None:
    # C = C1 and C2 isolates the target; T = C1 and not C2 is the tracker: q(C) = q(C1) - q(T)
    c1 = OCCUPATION[TARGET] == OCCUPATION
    c2 = ids([TARGET]) | (~c1)
    outputs = [[flt(c1)], [flt(c1 & ~c2)]]
    everything = [s for arrays in outputs for s in query_sets_of(arrays)]
    assert determined(N, everything, {TARGET})
    admitted, released, _ = run(outputs, mode)
    assert admitted == [True, False]
    assert nothing_small_determined(N, released)


@pytest.mark.parametrize("mode", MODES)
def test_double_tracker(mode: AuditMode) -> None:
    # T within U, C outside T, C within U: q(C) = q(U) + q(C or T) - q(T) - q(not C and U)
    c = ids([TARGET])
    u = c | (OCCUPATION != 2)
    t = u & ~c & FEMALE
    outputs = [[flt(u)], [flt(c | t)], [flt(t)], [flt(~c & u)]]
    everything = [s for arrays in outputs for s in query_sets_of(arrays)]
    assert determined(N, everything, {TARGET})
    admitted, released, _ = run(outputs, mode)
    assert not all(admitted)
    assert not determined(N, released, {TARGET})
    assert nothing_small_determined(N, released)


@pytest.mark.parametrize("mode", MODES)
def test_union_tracker(mode: AuditMode) -> None:
    # disjoint groups G_i; q(C) = q(C or G_1) - q(G_1)
    c = ids([TARGET])
    groups = [(g == OCCUPATION) & ~c for g in range(3)]
    outputs = [[flt(c | groups[0])], [flt(groups[0])]]
    everything = [s for arrays in outputs for s in query_sets_of(arrays)]
    assert determined(N, everything, {TARGET})
    admitted, released, _ = run(outputs, mode)
    assert admitted == [True, False]
    assert nothing_small_determined(N, released)


@pytest.mark.parametrize("mode", MODES)
def test_group_of_five_reconstruction_in_eleven_steps(mode: AuditMode) -> None:
    group = [3, 29, 41, 77, 102]  # five people, fewer than K
    pad = ids(range(60, 100)) & ~ids(group)
    outputs = [[flt(pad)]]
    for member in group:
        outputs.append([flt(pad | ids([member]))])
        outputs.append([flt(pad | ids([m for m in group if m != member]))])
    assert len(outputs) == 11
    everything = [s for arrays in outputs for s in query_sets_of(arrays)]
    assert all(determined(N, everything, {m}) for m in group)
    admitted, released, _ = run(outputs, mode)
    assert admitted[0] and not all(admitted)
    assert not any(determined(N, released, {m}) for m in group)
    assert nothing_small_determined(N, released)


@pytest.mark.parametrize("mode", MODES)
def test_histogram_tracker_with_shifted_bin_edges(mode: AuditMode) -> None:
    income = np.concatenate([np.arange(0, 40), np.arange(60, 100), np.arange(100, 140)]).astype(
        float
    )
    income[TARGET] = 52.0  # alone in [50, 60)
    n = income.size

    def hist(edges: list[float]) -> np.ndarray:
        return (np.searchsorted(edges, income, side="right") - 1).astype(np.int32)

    outputs = [
        [hist([0, 25, 50, 75, 100, 150])],
        [hist([0, 30, 60, 90, 120, 150])],
        [hist([0, 20, 40, 70, 100, 150])],
    ]
    everything = [s for arrays in outputs for s in query_sets_of(arrays)]
    assert determined(n, everything, {TARGET})
    admitted, released, _ = run(outputs, mode, n=n)
    assert admitted[0] and not all(admitted)
    assert not determined(n, released, {TARGET})
    assert nothing_small_determined(n, released)


@pytest.mark.parametrize("mode", MODES)
def test_differencing_two_dataset_versions(mode: AuditMode) -> None:
    # v2 adds 15 records and lacks the target; the researcher tabulates v1 and v2's old records
    n2 = N + 15
    old_v1 = np.zeros(n2, dtype=bool)
    old_v1[:N] = True
    old_in_v2 = old_v1 & ~ids([TARGET], n2)
    occupation = np.concatenate([OCCUPATION, rng.integers(0, 3, 15)])
    v1_table = cells(occupation[:N])
    v2_table = cells(occupation, old_in_v2)
    v2_everyone = cells(occupation, ~ids([TARGET], n2))
    everything = query_sets_of([np.concatenate([v1_table, np.full(15, -1, np.int32)])])
    everything += query_sets_of([v2_table])
    assert determined(n2, everything, {TARGET})
    # same table on v2 (with its new records) is fine; the restricted one completes the attack
    admitted, released, state = run(
        [[v1_table], [v2_everyone], [v2_table]], mode, n=n2, grow_before={0: N, 1: n2}
    )
    assert state.n_records == n2
    assert admitted[0] and not admitted[2]
    assert not determined(n2, released, {TARGET})
    assert nothing_small_determined(n2, released)


@pytest.mark.parametrize("mode", MODES)
def test_colluding_researchers_sharing_a_scope(mode: AuditMode) -> None:
    # one asks for everyone, the other (same project state) for everyone but the target
    admitted, released, _ = run([[flt(ids(range(N)))], [flt(~ids([TARGET]))]], mode)
    assert admitted == [True, False]
    assert nothing_small_determined(N, released)


def test_benign_research_is_released_in_span_mode() -> None:
    r = np.random.default_rng(7)
    n = 500
    region = r.integers(0, 4, n)
    age = r.integers(0, 5, n)
    sex = r.integers(0, 2, n)
    occupation = r.integers(0, 3, n)
    outputs = [
        [cells(region * 2 + sex)],  # region x sex
        [cells(region * 5 + age)],  # region x age band
        [cells(sex * 5 + age)],  # sex x age band
        [cells(region)],  # region margin
        [cells(occupation)],  # mean income by occupation
        [cells(occupation * 2 + sex)],  # mean income by occupation and sex
        [cells(np.zeros(n))],  # regression of income on age and sex: everyone
    ]
    policy = AuditPolicy(mode=AuditMode.SPAN, k=K)
    state = AuditState.empty(n)
    released: list[frozenset[int]] = []
    for arrays in outputs:
        result = admit(state, arrays, policy)
        assert result.admitted, result.reason
        assert result.state is not None
        state = result.state
        released += query_sets_of(arrays)
    assert state.n_atoms > 80 and int((state.sizes < K).sum()) > 50  # atoms mode would refuse
    assert nothing_small_determined(n, released)
    atoms_admitted, _, _ = run(outputs, AuditMode.ATOMS, n=n)
    assert not all(atoms_admitted)
