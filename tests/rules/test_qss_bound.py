"""The query-set admission's bound and guard (issue 41 §1): a history whose exact search would
run for minutes is decided within its operation budget, the CPU guard and the interruption end
it too, and none of them ever releases."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from safeaccess.rules.qss import AuditPolicy, AuditState, admit
from safeaccess.rules.qss.certificate import TooCostly, decide
from safeaccess.rules.qss.guard import (
    SEARCH_OPERATIONS,
    Budget,
    Interrupted,
    interrupt_all,
    resume_all,
)

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
