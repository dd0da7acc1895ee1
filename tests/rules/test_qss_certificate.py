"""The rank certificate and its exact search, against a brute-force rational oracle.

`decide` is called directly (no fast paths in front of it) on random small instances: rows over
atoms with random record counts. The oracle tries every support of fewer than k records with
exact rational ranks, so every signed combination of every size is covered."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from _qss_oracle import _rational_rank, smallest_support
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safeaccess.rules.qss import AuditPolicy, AuditState, admit
from safeaccess.rules.qss.certificate import Certified, Determined, TooCostly, decide
from safeaccess.rules.qss.modp import random_prime


def _independent(rows: list[list[int]]) -> list[list[int]]:
    kept: list[list[int]] = []
    for row in rows:
        trial = [*kept, row]
        if _rational_rank([[Fraction(x) for x in r] for r in trial]) == len(trial):
            kept = trial
    return kept


def _csr(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    indptr = [0]
    indices: list[int] = []
    for row in rows:
        indices += [j for j, x in enumerate(row) if x]
        indptr.append(len(indices))
    return np.asarray(indptr, dtype=np.int64), np.asarray(indices, dtype=np.int32)


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[list[int]], list[int], int]:
    k = draw(st.integers(2, 8))
    m = draw(st.integers(1, 11))
    sizes = draw(st.lists(st.integers(1, k + 2), min_size=m, max_size=m))
    n_rows = draw(st.integers(1, 7))
    rows = draw(
        st.lists(
            st.lists(st.integers(0, 1), min_size=m, max_size=m), min_size=n_rows, max_size=n_rows
        )
    )
    rows = _independent([r for r in rows if any(r)])
    return rows, sizes, k


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_decide_matches_the_rational_oracle(case: tuple[list[list[int]], list[int], int]) -> None:
    rows, sizes, k = case
    indptr, indices = _csr(rows)
    verdict = decide(
        indptr, indices, len(sizes), np.asarray(sizes, np.int64), k, random_prime(), 10_000
    )
    smallest = smallest_support(rows, sizes, k)
    assert not isinstance(verdict, TooCostly)
    if smallest is None:
        assert isinstance(verdict, Certified), verdict
    else:
        assert isinstance(verdict, Determined), (smallest, verdict)
        assert smallest <= verdict.records < k
        # the support it names really is one: the columns outside it lose rank
        outside = [j for j in range(len(sizes)) if j not in verdict.atoms]
        matrix = [[Fraction(r[j]) for j in outside] for r in rows]
        assert _rational_rank(matrix) < len(rows)
        assert verdict.rows, "a determined combination combines at least one row"


def _admit_all(n: int, k: int, outputs: list[list[np.ndarray]]):  # type: ignore[no-untyped-def]
    state = AuditState.empty(n)
    results = []
    for arrays in outputs:
        result = admit(state, arrays, AuditPolicy(k=k))
        results.append(result)
        if result.admitted:
            assert result.state is not None
            state = result.state
    return results


def _cells(n: int, members: list[int]) -> np.ndarray:
    array = np.full(n, -1, dtype=np.int32)
    array[members] = 0
    return array


def test_a_signed_swap_of_two_people_is_refused() -> None:
    """ "C + person 1" and "C + person 2": each large, their difference is two people."""
    n, k = 200, 10
    common = list(range(2, 120))
    results = _admit_all(n, k, [[_cells(n, [*common, 0])], [_cells(n, [*common, 1])]])
    assert results[0].admitted
    assert not results[1].admitted
    assert results[1].smallest_isolated == 2
    assert results[1].facts["conflicts_with"] == [results[0].facts["origin"]]


def test_a_union_of_four_single_records_is_refused() -> None:
    """Four people a, b, c, d in four different atoms (two large sets split them), then the
    universe less the four: their union, four one-record atoms, is determined. Union searches
    of up to three atoms miss it."""
    n, k = 300, 10
    rng = np.random.default_rng(3)
    pool = np.arange(4, n)
    d_set = [int(x) for x in rng.choice(pool, 120, replace=False)]
    e_set = [int(x) for x in rng.choice(pool, 120, replace=False)]
    outputs = [
        [_cells(n, list(range(n)))],
        [_cells(n, [*d_set, 0, 1])],
        [_cells(n, [*e_set, 0, 2])],
        [_cells(n, list(range(4, n)))],
    ]
    results = _admit_all(n, k, outputs)
    assert [r.admitted for r in results] == [True, True, True, False]
    assert results[-1].smallest_isolated is not None and results[-1].smallest_isolated <= 4
    assert results[-1].facts["certificate"]["verdict"] == "determined"


def test_four_ordinary_marginals_of_100_000_people_are_released() -> None:
    """The utility case of issue 20: region; sex × age band; ethnicity × employment; health.
    Almost every atom is below k, yet nothing small is determined."""
    rng = np.random.default_rng(7)
    n = 100_000
    region = rng.integers(0, 10, n)
    sex = rng.integers(0, 2, n)
    band = rng.integers(0, 16, n)
    ethnicity = rng.integers(0, 6, n)
    employment = rng.integers(0, 4, n)
    health = rng.integers(0, 5, n)
    tables = [region, sex * 16 + band, ethnicity * 4 + employment, health]
    outputs = [[np.zeros(n, dtype=np.int32)]] + [[t.astype(np.int32)] for t in tables]
    results = _admit_all(n, 10, outputs)
    assert all(r.admitted for r in results), [r.reason for r in results]
    last = results[-1]
    assert last.facts["atoms_below_k_after"] > 0.9 * last.facts["atoms_after"]
    assert last.facts["certificate"]["verdict"] == "certified"
