"""Weighted rows in the query-set auditor (issue 41): a fit's design column over the value
groups of a few-valued regressor is admitted as its weighted row, not as one row per group.

Expected verdicts are worked out by hand from the linear algebra (which combinations of value
groups the rows determine), never by the auditor itself."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from safeaccess.rules.qss import AuditPolicy, AuditState, QuerySetError, WeightedSet, admit, modp

N = 600
POLICY = AuditPolicy(k=10)


def _groups() -> np.ndarray:
    """Values 0..3 of a few-valued column: group 2 holds one record, the others many."""
    values = np.resize(np.array([0, 1, 3], dtype=np.int8), N)
    values[0] = 2
    return values


def _model() -> np.ndarray:
    return np.zeros(N, dtype=np.int8)


def _power(groups: np.ndarray, power: int) -> WeightedSet:
    return WeightedSet(groups, (np.arange(4.0) ** power).reshape(1, -1))


@pytest.mark.parametrize("value", [1.0, 0.5, -3.25, float(np.log1p(8)), 1e-300, 1e300, 0.0])
def test_a_float_is_taken_mod_p_as_the_exact_rational_it_is(value: float) -> None:
    p = modp.random_prime()
    exact = Fraction(value)
    expected = exact.numerator % p * pow(exact.denominator, -1, p) % p
    assert int(modp.float_mod(np.array([value]), p)[0]) == expected


def test_one_unsaturated_fit_is_released_and_a_saturated_design_refused() -> None:
    groups = _groups()
    one = admit(AuditState.empty(N), [_model()], POLICY, [_power(groups, 1)])
    assert one.admitted
    # array 1 (after the one plain array) row 0: the weighted row was kept
    assert (1, 0) in one.kept_keys
    saturated = WeightedSet(groups, np.eye(4))
    assert not admit(AuditState.empty(N), [_model()], POLICY, [saturated]).admitted


def test_powers_of_one_column_accumulate_to_the_vandermonde_span() -> None:
    # rows 1, x, x^2 on four values leave one dimension free; x^3 completes the span and
    # determines the group of one record
    groups = _groups()
    state = AuditState.empty(N)
    for power in (1, 2):
        admission = admit(state, [_model()], POLICY, [_power(groups, power)])
        assert admission.admitted and admission.state is not None
        state = admission.state
    third = admit(state, [_model()], POLICY, [_power(groups, 3)])
    assert not third.admitted and third.smallest_isolated == 1


def test_a_plain_release_meets_the_weighted_rows_in_one_matrix() -> None:
    # the fit gives S and 0 G0 + 1 G1 + 2 G2 + 3 G3; the groups 0 and 1 as a table then leave
    # G2 + G3 and 2 G2 + 3 G3, which determine G2 (one record)
    groups = _groups()
    fit = admit(AuditState.empty(N), [_model()], POLICY, [_power(groups, 1)])
    assert fit.state is not None
    lower = np.where(groups <= 1, groups, -1).astype(np.int8)
    assert not admit(fit.state, [lower], POLICY).admitted
    # their union alone (one cell) leaves G2 + G3 and 2 G2 + 3 G3 minus an unknown G1: free
    union = np.where(groups <= 1, 0, -1).astype(np.int8)
    assert admit(fit.state, [union], POLICY).admitted


def test_a_weighted_state_survives_its_encoding() -> None:
    groups = _groups()
    fit = admit(AuditState.empty(N), [_model()], POLICY, [_power(groups, 1)])
    assert fit.state is not None and fit.state.constraints is not None
    again = AuditState.from_bytes(fit.state.to_bytes())
    assert again.constraints is not None and again.constraints.data is not None
    assert np.array_equal(again.constraints.data, fit.state.constraints.data)
    lower = np.where(groups <= 1, groups, -1).astype(np.int8)
    assert not admit(again, [lower], POLICY).admitted
    assert admit(again, [_model()], POLICY, [_power(groups, 2)]).admitted


def test_atoms_mode_keeps_the_strict_value_group_rule() -> None:
    policy = AuditPolicy(k=10, mode="atoms")
    assert not admit(AuditState.empty(N), [_model()], policy, [_power(_groups(), 1)]).admitted


def test_bad_weights_are_refused_with_a_clear_error() -> None:
    groups = _groups()
    with pytest.raises(QuerySetError, match="weights of shape"):
        admit(AuditState.empty(N), [_model()], POLICY, [WeightedSet(groups, np.ones((1, 2)))])
    with pytest.raises(QuerySetError, match="finite"):
        bad = np.array([[0.0, 1.0, np.nan, 3.0]])
        admit(AuditState.empty(N), [_model()], POLICY, [WeightedSet(groups, bad)])


def test_a_weighted_scope_carries_its_kept_sets() -> None:
    # the kept certificate holds weighted columns: a later ordinary table over a weighted state
    # is decided by the sets carried over, not from scratch
    groups = _groups()
    fit = admit(AuditState.empty(N), [_model()], POLICY, [_power(groups, 1)])
    assert fit.state is not None
    halves = (np.arange(N) % 2).astype(np.int8)
    later = admit(fit.state, [halves], POLICY)
    assert later.admitted and later.state is not None
    again = admit(later.state, [(np.arange(N) % 3 == 0).astype(np.int8)], POLICY)
    assert again.admitted
    assert again.facts["certificate"]["kept"] is True


def _oracle_rows(
    n: int, history: list[tuple[list[np.ndarray], list[WeightedSet]]]
) -> tuple[list[list[float]], list[int]]:
    """Every admitted row over the atoms of the history (records with the same cell in every
    array and the same group in every weighted set), computed here from the arrays alone."""
    keys = [
        tuple(
            [int(a[r]) for arrays, _ in history for a in arrays]
            + [int(w.cells[r]) for _, sets in history for w in sets]
        )
        for r in range(n)
    ]
    atoms = sorted(set(keys))
    members = [[r for r in range(n) if keys[r] == atom] for atom in atoms]
    rows: list[list[float]] = []
    for arrays, sets in history:
        for a in arrays:
            for c in sorted({int(x) for x in a if x >= 0}):
                rows.append([1.0 if a[m[0]] == c else 0.0 for m in members])
        for w in sets:
            for j in range(w.weights.shape[0]):
                rows.append(
                    [
                        0.0 if w.cells[m[0]] < 0 else float(w.weights[j, w.cells[m[0]]])
                        for m in members
                    ]
                )
    return rows, [len(m) for m in members]


def test_weighted_verdicts_agree_with_exact_rational_brute_force() -> None:
    # an admission is never a release of a determined small combination; a refusal names one
    # (or is a refusal for cost, which the search may reach on such tiny atoms)
    from _qss_oracle import smallest_support

    rng = np.random.default_rng(41)
    n, k = 16, 3
    policy = AuditPolicy(k=k)
    released = refused = 0
    for _ in range(8):
        state = AuditState.empty(n)
        history: list[tuple[list[np.ndarray], list[WeightedSet]]] = []
        for _ in range(3):
            inside = rng.random(n) < 0.8
            arrays = [np.where(inside, rng.integers(0, 2, n), -1).astype(np.int8)]
            groups = np.where(inside, rng.integers(0, 4, n), -1).astype(np.int8)
            values = np.log1p(rng.integers(0, 9, 4).astype(float))
            weights = np.stack([values, values * values])[: int(rng.integers(1, 3))]
            sets = [WeightedSet(groups, weights)]
            admission = admit(state, arrays, policy, sets)
            rows, sizes = _oracle_rows(n, [*history, (arrays, sets)])
            safe = smallest_support(rows, sizes, k) is None
            if admission.admitted:
                assert safe
                assert admission.state is not None
                state = admission.state
                history.append((arrays, sets))
                released += 1
            elif "cost" not in admission.facts:
                assert not safe
                refused += 1
    assert released and refused


def test_the_mixed_cross_products_equal_the_exact_ones() -> None:
    # the fast path (0/1 rows by one float product, weighted rows exactly) against every term
    # reduced exactly, on a state with weighted and 0/1 rows and new rows of both kinds
    from safeaccess.rules.qss import constraints as cons

    groups = _groups()
    state = admit(AuditState.empty(N), [_model()], POLICY, [_power(groups, 1)]).state
    assert state is not None
    state = admit(state, [(np.arange(N) % 2).astype(np.int8)], POLICY).state
    assert state is not None and state.constraints is not None
    c = state.constraints
    m = c.n_atoms
    rng = np.random.default_rng(3)
    plain = rng.integers(-1, 3, m).astype(np.int64)
    single = np.where(rng.random(m) < 0.5, 0, -1).astype(np.int64)
    index = [plain, np.where(single >= 0, 3, -1)]
    weights = [None, rng.normal(size=m)]
    lanes = [cons._weights_mod(weights, lane.p) for lane in c.lanes]
    mixed = cons._cross_products_mixed(c, index, 4, lanes)
    exact = cons._cross_products_weighted(c, index, 4, lanes)
    for a, b in zip(mixed, exact, strict=True):
        assert np.array_equal(a, b)
