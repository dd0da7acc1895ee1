"""The query-set admission's bound and guard (issue 41 §1): a history whose exact search would
run for minutes is decided within its operation budget, the CPU guard and the interruption end
it too, and none of them ever releases."""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from safeaccess.rules.qss import AuditPolicy, AuditState, admit
from safeaccess.rules.qss.certificate import Certified, TooCostly, decide
from safeaccess.rules.qss.guard import (
    SEARCH_OPERATIONS,
    Budget,
    Interrupted,
    interrupt_all,
    resume_all,
)
from safeaccess.rules.qss.modp import random_prime

K = 10


def _two_tables(per: int, levels: int) -> tuple[AuditState, np.ndarray]:
    """The universe and table `a` admitted; table `b`'s query set. Each table cell holds `per`
    records and each cross cell one or two: the smallest determined combination is a table cell
    (`per` >= k records, truly safe), but a `per`-regular bipartite graph has at most `per`/2
    disjoint spanning trees, so no certificate of disjoint completing sets exists."""
    n = per * levels
    a = (np.arange(n) // per).astype(np.int32)
    b = (np.random.default_rng(1).permutation(n) // per).astype(np.int32)
    policy = AuditPolicy(k=K)
    state = AuditState.empty(n)
    for array in (np.zeros(n, np.int32), a):
        admitted = admit(state, [array], policy)
        assert admitted.admitted and admitted.state is not None
        state = admitted.state
    return state, b


@pytest.fixture
def restored() -> Iterator[None]:
    yield
    resume_all()


def test_a_deep_search_ends_at_its_operation_budget_and_is_refused() -> None:
    # 2 250 records: the search before the bound ran for more than 5 minutes here
    state, b = _two_tables(15, 150)
    result = admit(state, [b], AuditPolicy(k=K))
    assert not result.admitted
    assert result.reason is not None and result.reason.startswith("refused for cost")
    certificate = result.facts["certificate"]
    assert certificate["verdict"] == "toocostly"
    assert certificate["limit"] == "operations"
    assert certificate["operations"] > SEARCH_OPERATIONS
    assert certificate["nodes"] < AuditPolicy(k=K).search_nodes  # not the branch count


def test_the_cpu_guard_ends_a_decision_with_the_refusal_for_cost() -> None:
    n = 12 * 20
    b = np.random.default_rng(1).permutation(n) // 12
    # the independent rows of the three tables over their atoms (universe, a, b less one
    # cell each): the certificate's root packing cannot complete, so the search starts
    a = np.arange(n) // 12
    atom = a * 20 + b
    atoms, atom_of = np.unique(atom, return_inverse=True)
    sizes = np.bincount(atom_of).astype(np.int64)
    rows = [np.arange(atoms.shape[0])]
    rows += [np.unique(atom_of[a == i]) for i in range(1, 20)]
    rows += [np.unique(atom_of[b == j]) for j in range(1, 20)]
    indptr = np.concatenate([[0], np.cumsum([r.shape[0] for r in rows])]).astype(np.int64)
    indices = np.concatenate(rows).astype(np.int32)
    verdict = decide(
        indptr, indices, int(sizes.shape[0]), sizes, K, 2_147_483_647, spend=Budget(cpu_seconds=0)
    )
    assert isinstance(verdict, TooCostly) and verdict.limit == "cpu"


def test_interruption_ends_an_admission_without_a_decision(restored: None) -> None:
    state, b = _two_tables(12, 20)
    interrupt_all()
    with pytest.raises(Interrupted):
        admit(state, [b], AuditPolicy(k=K))
    resume_all()
    # nothing was decided: once allowed again, the same admission is decided (for cost here)
    assert not admit(state, [b], AuditPolicy(k=K)).admitted


def test_an_ordinary_admission_needs_no_search() -> None:
    # two tables whose cells and cross cells are all large: certified with no branch
    n = 4000
    rng = np.random.default_rng(2)
    state = AuditState.empty(n)
    policy = AuditPolicy(k=K)
    for array in (np.zeros(n, np.int32), rng.integers(0, 4, n), rng.integers(0, 3, n)):
        result = admit(state, [array.astype(np.int32)], policy)
        assert result.admitted and result.state is not None
        assert result.facts["certificate"]["nodes"] <= 1
        state = result.state


def _survey(n: int) -> list[np.ndarray]:
    """Issue 41's ordinary survey history on n synthetic records, as the auditor receives it:
    the universe, twelve ordinary tables and crosstabs (some filtered), then the report's step,
    health × age of the West's women with the cells below k suppressed (their records are not
    in any released cell). The columns are drawn independently, like the demo census."""
    rng = np.random.default_rng(41)
    region, sex, health = rng.integers(0, 4, n), rng.integers(0, 2, n), rng.integers(0, 5, n)
    age, employment, ethnicity = (
        rng.integers(16, 96, n),
        rng.integers(0, 3, n),
        rng.integers(0, 5, n),
    )
    band = np.digitize(age, [25, 35, 45, 55, 65, 75])

    def cells(*columns: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
        key = np.zeros(n, np.int64)
        for column in columns:
            key = key * 100 + column
        out = np.unique(key, return_inverse=True)[1].astype(np.int32)
        if where is not None:
            out[~where] = -1
        return out

    employed = employment == 0
    report = cells(health, age, where=(region == 3) & (sex == 1))
    counts = np.bincount(report[report >= 0])
    report[np.isin(report, np.flatnonzero(counts < K))] = -1  # suppressed
    return [
        np.zeros(n, np.int32),
        cells(region, sex),
        cells(ethnicity, sex),
        cells(band),
        cells(health),
        cells(region, where=employed),
        cells(sex, health),
        cells(employment, sex),
        cells(region, health, where=employed),
        cells(age >= 18),
        cells(band, sex),
        cells(region, band),
        cells(ethnicity, employment),
        report,
    ]


def test_the_ordinary_survey_step_is_released_without_a_search() -> None:
    # Issue 41's own ordinary step. Its released cells hold 10 to 15 records in 5 to 9 atoms of
    # one to three records, so every completing set must take an atom of each, and disjoint sets
    # run out of them (Σ of their smallest atoms stays below k): the exact search then went past
    # its 400 branches and the step was refused for cost (11 s of CPU; 16 000 records is the
    # smallest size of this history, in steps of 2 000, that did it). Counted by records, an
    # atom of n records serves n sets and the cells' records give k sets room: certified by
    # the root packing or the kept sets.
    policy = AuditPolicy(k=K)
    state = AuditState.empty(16_000)
    *history, report = _survey(16_000)
    for array in history:
        result = admit(state, [array], policy)
        assert result.admitted and result.state is not None
        state = result.state
    result = admit(state, [report], policy)
    assert result.admitted, result.reason
    assert result.facts["certificate"]["verdict"] == "certified"
    assert result.facts["certificate"]["nodes"] <= 1


def test_a_cell_of_k_records_in_few_atoms_is_certified_at_the_root() -> None:
    # The smallest such case, worked by hand: 11 records, the universe and a cell of 6 records
    # in three atoms of 2; the complement holds atoms of 4 and 1. The row space is
    # a·cell + b·universe: b ≠ 0 puts both complement atoms in the support (5 records), b = 0
    # the cell's three (6 records), so nothing below k = 5 is determined. Disjoint sets each
    # need a cell atom and a complement atom, so their smallest atoms add up to at most 3; by
    # records (2, 2, 2 and 4, 1) five sets fit.
    from _qss_oracle import smallest_support

    rows = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    sizes = [2, 2, 2, 4, 1]
    assert smallest_support(rows, sizes, 5) is None  # the exact rational brute force agrees
    indptr = np.array([0, 3, 8], np.int64)
    indices = np.array([0, 1, 2, 0, 1, 2, 3, 4], np.int32)
    verdict = decide(indptr, indices, 5, np.asarray(sizes, np.int64), 5, random_prime(), 0)
    assert isinstance(verdict, Certified), verdict  # max_nodes 0: certified by the root alone
    assert verdict.sets == 5


@st.composite
def _instances(draw: st.DrawFn) -> tuple[list[list[int]], list[int], int]:
    k = draw(st.integers(2, 7))
    m = draw(st.integers(2, 9))
    sizes = draw(st.lists(st.integers(1, k + 1), min_size=m, max_size=m))
    rows = draw(
        st.lists(st.lists(st.integers(0, 1), min_size=m, max_size=m), min_size=1, max_size=5)
    )
    return rows, sizes, k


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_instances())
def test_the_root_certificate_never_releases_what_brute_force_finds(
    case: tuple[list[list[int]], list[int], int],
) -> None:
    # the root packings alone (no branch: max_nodes 0), the one by records among them: a
    # certificate is never given where the exact rational brute force finds a small support
    from _qss_oracle import _rational_rank, smallest_support

    rows, sizes, k = case
    kept: list[list[int]] = []
    for row in rows:
        trial = [*kept, row]
        if any(row) and _rational_rank([[Fraction(x) for x in r] for r in trial]) == len(trial):
            kept = trial
    assume(kept)
    indptr = np.cumsum([0, *(sum(r) for r in kept)]).astype(np.int64)
    indices = np.asarray([j for r in kept for j, x in enumerate(r) if x], np.int32)
    verdict = decide(indptr, indices, len(sizes), np.asarray(sizes, np.int64), k, random_prime(), 0)
    if isinstance(verdict, Certified):
        assert smallest_support(kept, sizes, k) is None
