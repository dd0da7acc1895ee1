"""Chen et al.'s distance metrics: DCR / y-privacy, (y,p)-coverage, p-privacy (the paper's worked
example, p = 2/27), dependency cliques and the statistical error, against hand cases and brute
force."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from safeaccess.rules.synthetic import (
    SyntheticCheckError,
    dcr,
    dcr_loo,
    dcr_report,
    dependency_cliques,
    distance_features,
    p_privacy,
    statistical_error,
    tvd,
    yp_coverage,
    yp_coverage_sampled,
)

# ---- DCR ----------------------------------------------------------------------------------


def test_dcr_hand_case_with_ties_to_the_lowest_index():
    real = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    syn = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 4.0], [1.0, 1.0]])
    dist, idx = dcr(syn, real)
    # (1,0): 1 from real 0 and real 1 -> 0; (2,0): copy of real 1 (and its duplicate 3) -> 1;
    # (3,4): sqrt(1+16) from real 1/3, sqrt(9+4) from real 2 -> real 2;
    # (1,1): sqrt 2 from real 0, 1, 2 -> 0
    assert idx.tolist() == [0, 1, 2, 0]
    assert dist == pytest.approx([1.0, 0.0, math.sqrt(13), math.sqrt(2)])


def test_dcr_many_equidistant_neighbours_still_picks_the_lowest_index():
    # 12 real points on a circle around the origin, the lowest index listed last
    angles = np.linspace(0, 2 * np.pi, 12, endpoint=False)
    ring = np.c_[np.cos(angles), np.sin(angles)]
    ring = np.round(ring * 4) / 4  # lattice points, so some radii tie exactly
    real = np.r_[ring[::-1], [[10.0, 10.0]]]
    syn = np.zeros((1, 2))
    dist, idx = dcr(syn, real)
    brute = np.sqrt(((real - syn[0]) ** 2).sum(axis=1))
    assert dist[0] == pytest.approx(brute.min())
    assert idx[0] == int(np.flatnonzero(brute == brute.min()).min())


@pytest.mark.parametrize("dim", [1, 3, 10, 14])
@pytest.mark.parametrize("seed", range(6))
def test_dcr_matches_brute_force(dim, seed):
    rng = np.random.default_rng(seed)
    real = rng.integers(0, 3, size=(60, dim)).astype(float)  # coarse: many exact ties
    syn = rng.integers(0, 3, size=(40, dim)).astype(float)
    dist, idx = dcr(syn, real)
    full = np.sqrt(((syn[:, None, :] - real[None, :, :]) ** 2).sum(axis=2))
    assert dist == pytest.approx(full.min(axis=1))
    assert idx.tolist() == [int(np.flatnonzero(row == row.min()).min()) for row in full]


@pytest.mark.parametrize("threads", ["1", "2", None])
@pytest.mark.parametrize("dim", [2, 5, 10])
def test_dcr_on_continuous_data_matches_brute_force_on_any_thread_count(dim, threads, monkeypatch):
    # continuous points (the k-d tree path with reordered, threaded queries), plus exact copies
    # and a duplicated real row so ties to the lowest index are still exercised
    if threads is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
    rng = np.random.default_rng(100 + dim)
    real = rng.random((300, dim))
    real[17] = real[250]
    syn = np.r_[rng.random((200, dim)), real[[250, 3, 299]]]
    dist, idx = dcr(syn, real)
    full = np.sqrt(((syn[:, None, :] - real[None, :, :]) ** 2).sum(axis=2))
    assert dist == pytest.approx(full.min(axis=1), abs=1e-12)
    assert idx.tolist() == [int(np.flatnonzero(row == row.min()).min()) for row in full]
    assert idx[-3] == 17  # the copy of row 250 resolves to its lower-index twin
    loo, loo_idx = dcr_loo(real)
    np.fill_diagonal(full_r := np.sqrt(((real[:, None] - real[None]) ** 2).sum(axis=2)), np.inf)
    assert loo == pytest.approx(full_r.min(axis=1), abs=1e-12)
    assert loo[17] == 0.0 and loo_idx[17] == 250 and loo_idx[250] == 17


@pytest.mark.parametrize("dim", [2, 12])
def test_dcr_loo_excludes_only_the_record_itself(dim):
    rng = np.random.default_rng(dim)
    real = rng.integers(0, 3, size=(50, dim)).astype(float)
    real[7] = real[3]  # a duplicate is at distance 0 from its twin
    dist, idx = dcr_loo(real)
    full = np.sqrt(((real[:, None, :] - real[None, :, :]) ** 2).sum(axis=2))
    np.fill_diagonal(full, np.inf)
    assert dist == pytest.approx(full.min(axis=1))
    assert dist[3] == 0.0 and dist[7] == 0.0
    assert all(idx[j] != j and full[j, idx[j]] == pytest.approx(dist[j]) for j in range(50))


def test_dcr_loo_for_chosen_rows_and_the_sampled_report_above_dimension_10():
    rng = np.random.default_rng(9)
    real = rng.integers(0, 3, size=(80, 12)).astype(float)
    full, _ = dcr_loo(real)
    part, idx = dcr_loo(real, [5, 0, 79])
    assert part == pytest.approx(full[[5, 0, 79]]) and 5 not in idx[:1]
    syn = np.r_[real[:10], rng.integers(0, 3, size=(70, 12)).astype(float)]
    sampled = dcr_report(syn, real, sample=30, seed=1)
    assert sampled.exact_copy_share >= 10 / 80  # counted on all rows, not the sample
    assert 0.0 <= sampled.p_syn <= 1.0
    with pytest.raises(SyntheticCheckError, match="rows must be indices"):
        dcr_loo(real, [80])


def test_distance_features_scale_numeric_and_one_hot_categorical():
    data = np.array([[10.0, 0], [20.0, 2], [15.0, 2]])
    f = distance_features(data, [(10.0, 30.0), 3])
    # numeric: (x - 10) / 20; categorical codes differ -> distance 1
    assert np.linalg.norm(f[0] - f[1]) == pytest.approx(math.sqrt(0.5**2 + 1))
    assert np.linalg.norm(f[1] - f[2]) == pytest.approx(0.25)
    with pytest.raises(SyntheticCheckError, match="lower < upper"):
        distance_features(data, [(1.0, 1.0), 3])
    with pytest.raises(SyntheticCheckError, match=r"codes must be integers in 0\.\.1"):
        distance_features(data, [(10.0, 30.0), 2])


def test_dcr_report_identity_and_far_data():
    rng = np.random.default_rng(0)
    real = rng.random((400, 3))
    same = dcr_report(real, real)
    assert same.y_privacy_min == 0.0 and same.exact_copy_share == 1.0 and same.p_syn == 1.0
    # the LOO threshold is the 5 % quantile: about 5 % of real records fall at or below it
    assert same.p_ref == pytest.approx(0.05, abs=0.01)
    far = dcr_report(real + 5.0, real)
    assert far.p_syn == 0.0 and far.exact_copy_share == 0.0 and far.z < 0
    assert far.y_privacy_min > 4.0


# ---- (y,p)-coverage -----------------------------------------------------------------------


def brute_assignment(cost):
    """Minimum total cost over all injective maps of the smaller side into the larger."""
    n_s, n_r = cost.shape
    best, best_pairs = math.inf, None
    if n_s <= n_r:
        for perm in itertools.permutations(range(n_r), n_s):
            total = sum(cost[i, perm[i]] for i in range(n_s))
            if total < best:
                best, best_pairs = total, [(i, perm[i]) for i in range(n_s)]
    else:
        for perm in itertools.permutations(range(n_s), n_r):
            total = sum(cost[perm[j], j] for j in range(n_r))
            if total < best:
                best, best_pairs = total, sorted((perm[j], j) for j in range(n_r))
    return best, best_pairs


@pytest.mark.parametrize("seed", range(20))
def test_hungarian_coverage_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n_r, n_s = int(rng.integers(1, 7)), int(rng.integers(1, 7))
    real, syn = rng.random((n_r, 2)), rng.random((n_s, 2))
    y = 0.3
    cov = yp_coverage(real, syn, y, 0.5)
    cost = np.sqrt(((syn[:, None] - real[None]) ** 2).sum(axis=2))
    best, pairs = brute_assignment(cost)
    assert cov.omega is not None
    assert cov.omega.sum() == pytest.approx(best)
    assert list(zip(cov.matched_syn.tolist(), cov.matched_real.tolist(), strict=True)) == pairs
    omega = [cost[i, j] for i, j in pairs]
    zeta = sum(w <= y for w in omega)
    assert cov.zeta == zeta
    assert cov.p_prime == pytest.approx(zeta / min(n_r, n_s))
    assert cov.fulfilled == (zeta / min(n_r, n_s) <= 0.5)


def test_coverage_hand_case_and_nearest_is_conservative():
    real = np.array([[0.0], [1.0], [10.0]])
    syn = np.array([[0.1], [0.2], [5.0]])
    # matching: 0.1->0 (0.1), 0.2->1 (0.8), 5->10 (5); nearest: 0.1->0, 0.2->0, 5->1 (4)
    hung = yp_coverage(real, syn, 0.5, 0.5)
    assert hung.omega == pytest.approx([0.1, 0.8, 5.0])
    assert (hung.zeta, hung.fulfilled) == (1, True)
    near = yp_coverage(real, syn, 0.5, 0.5, method="nearest")
    assert near.omega is None and near.zeta == 2 and near.p_prime == pytest.approx(2 / 3)
    assert near.fulfilled is False
    assert near.p_prime >= hung.p_prime


def test_coverage_refuses_large_matchings_and_samples():
    rng = np.random.default_rng(1)
    real, syn = rng.random((30, 2)), rng.random((40, 2))
    with pytest.raises(SyntheticCheckError, match="limited to 20 records per side"):
        yp_coverage(real, syn, 0.1, 0.1, max_size=20)
    sampled = yp_coverage_sampled(real, syn, 0.1, 0.1, m=20, repeats=3, seed=3)
    assert sampled.m == 20 and len(sampled.p_primes) == 3
    assert sampled.p_prime_max >= sampled.p_prime_mean
    with pytest.raises(SyntheticCheckError, match="method must be"):
        yp_coverage(real, syn, 0.1, 0.1, method="greedy")  # type: ignore[arg-type]


# ---- p-privacy (Chen et al. 2021, Section 3.2.4 worked example) --------------------------

CHEN_O = np.array([[3, 5, 1, 2, 3], [8, 1, 2, 3, 4], [2, 2, 3, 4, 5]])
CHEN_D = np.array([[4, 5, 1, 2, 3], [8, 7, 2, 3, 4], [3, 1, 2, 3, 4]])


def test_chen_dependency_cliques():
    assert dependency_cliques(CHEN_D, 0.9) == [(0,), (1,), (2, 3, 4)]


def test_chen_p_privacy_example():
    f_size, xi, p = p_privacy(CHEN_O, CHEN_D, [(0,), (1,), (2, 3, 4)])
    assert (f_size, xi) == (18, 2)
    assert Fraction(p).limit_denominator(1000) == Fraction(2, 27)


def brute_p_privacy(real, syn, cliques):
    """Materialise F and count the distinct real rows in it."""
    parts = [sorted({tuple(row) for row in syn[:, list(c)]}) for c in cliques]
    f_rows = set()
    for combo in itertools.product(*parts):
        row = [0] * real.shape[1]
        for c, vals in zip(cliques, combo, strict=True):
            for col, v in zip(c, vals, strict=True):
                row[col] = v
        f_rows.add(tuple(row))
    xi = len({tuple(r) for r in real} & f_rows)
    return len(f_rows), xi, (xi / len(f_rows)) * (xi / len(real))


@pytest.mark.parametrize("seed", range(15))
def test_p_privacy_matches_materialised_f(seed):
    rng = np.random.default_rng(seed)
    real = rng.integers(0, 3, size=(12, 4))
    real[5] = real[2]  # duplicates count once in xi, every record in |O|
    syn = rng.integers(0, 3, size=(10, 4))
    cliques = [(0, 2), (1,), (3,)]
    assert p_privacy(real, syn, cliques) == pytest.approx(brute_p_privacy(real, syn, cliques))


def test_p_privacy_uncovered_columns_are_singletons_and_bad_cliques_are_named():
    assert p_privacy(CHEN_O, CHEN_D, [(2, 3, 4)]) == p_privacy(
        CHEN_O, CHEN_D, [(0,), (1,), (2, 3, 4)]
    )
    with pytest.raises(SyntheticCheckError, match="disjoint"):
        p_privacy(CHEN_O, CHEN_D, [(0, 1), (1, 2)])


def test_cramers_v_links_categorical_copies():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 4, 200)
    data = np.c_[a, (a + 1) % 4, rng.integers(0, 4, 200)]
    # (a+1) % 4 is a relabelling: V = 1 although Pearson is far from 1
    assert dependency_cliques(data, 0.9, categorical=[True, True, True]) == [(0, 1), (2,)]
    assert dependency_cliques(data, 0.9) == [(0,), (1,), (2,)]


# ---- statistical error (Eqs. 11-12) and TVD ----------------------------------------------


def test_statistical_error_hand_case():
    real = np.array([[1.0, 10.0], [3.0, 10.0]])  # mean 2, 10; var 1, 0
    syn = np.array([[2.0, 12.0], [4.0, 8.0]])  # mean 3, 10; var 1, 4
    pct, mean = statistical_error(real, syn, "mean")
    assert pct == pytest.approx([50.0, 0.0]) and mean == pytest.approx(25.0)
    pct, _ = statistical_error(real, syn, "var")
    assert pct[0] == 0.0 and pct[1] == math.inf  # departure from an exact zero variance
    pct, _ = statistical_error(real, syn, "sd", ddof=1)
    assert pct[0] == pytest.approx(0.0)
    assert statistical_error(real, syn, "std")[0][0] == pytest.approx(0.0)
    with pytest.raises(SyntheticCheckError, match="'mean', 'var' or 'sd'"):
        statistical_error(real, syn, "median")  # type: ignore[arg-type]


def test_tvd():
    assert tvd([1, 1], [2, 2]) == 0.0
    assert tvd([1, 0], [0, 3]) == 1.0
    assert tvd([3, 1], [-1, 2]) == pytest.approx(0.75)  # noisy -1 clipped to 0


def test_hamming_dcr_by_hand_and_against_all_pairs() -> None:
    from safeaccess.rules.synthetic.distance import hamming_dcr

    real = np.array([[0, 0], [0, 1], [1, 1]])
    syn = np.array([[0, 0], [1, 0], [2, 2]])
    # syn [0,0] is a real row; [1,0] differs from [0,0] and [1,1] in one column; [2,2] from
    # every real row in two. Each real row has another one column away.
    dist, loo = hamming_dcr(syn, real, [3, 3])
    assert dist.tolist() == [0.0, 1.0, pytest.approx(2**0.5)]
    assert loo.tolist() == [1.0, 1.0, 1.0]
    rng = np.random.default_rng(4)
    levels = [3, 4, 2, 5, 3]
    real = np.stack([rng.integers(0, lv, 300) for lv in levels], axis=1)
    syn = np.stack([rng.integers(0, lv, 200) for lv in levels], axis=1)
    pairs = (syn[:, None, :] != real[None, :, :]).sum(axis=2)  # every pair's Hamming distance
    own = (real[:, None, :] != real[None, :, :]).sum(axis=2) + np.diag([99] * 300)
    dist, loo = hamming_dcr(syn, real, levels)
    assert np.array_equal(dist**2, pairs.min(axis=1))
    assert np.array_equal(loo**2, own.min(axis=1))
    # the one-hot features' Euclidean DCR is the same distance
    feats = [distance_features(x, levels) for x in (syn, real)]
    report = dcr_report(feats[0], feats[1], distances=hamming_dcr(syn, real, levels))
    assert report.p_syn == pytest.approx(np.mean(pairs.min(axis=1) <= report.threshold**2))
    assert report == dcr_report(feats[0], feats[1])  # the k-d tree's search agrees


@pytest.mark.parametrize("dim", [4, 10])
def test_dcr_on_many_leaves_with_ties_and_duplicates_matches_brute_force(dim):
    # enough records for a k-d tree of many leaves (32 points each): a coarse lattice (exact
    # ties everywhere), continuous points, duplicated real rows and synthetic copies of them
    rng = np.random.default_rng(40 + dim)
    real = np.r_[rng.integers(0, 3, size=(1500, dim)) / 2.0, rng.random((1500, dim))]
    real[2900:2950] = real[1600:1650]  # duplicates: the copy at 1600..1649 has the lower index
    syn = np.r_[rng.integers(0, 3, size=(700, dim)) / 2.0, rng.random((700, dim)), real[2900:2950]]
    dist, idx = dcr(syn, real)
    want_d, want_i = [], []
    for start in range(0, syn.shape[0], 200):
        block = np.sqrt(((syn[start : start + 200, None, :] - real[None]) ** 2).sum(axis=2))
        want_d.extend(block.min(axis=1))
        want_i.extend(int(np.flatnonzero(row == row.min()).min()) for row in block)
    assert dist == pytest.approx(np.array(want_d), abs=1e-12)
    assert idx.tolist() == want_i
    assert idx[-50:].tolist() == list(range(1600, 1650))


def _report_from_full_searches(syn, real, quantile=0.05):
    """The report as the unbounded searches give it (every distance measured)."""
    return dcr_report(syn, real, quantile=quantile, distances=(dcr(syn, real)[0], dcr_loo(real)[0]))


@pytest.mark.parametrize(
    ("case", "quantile"),
    [("uniform", 0.05), ("copies", 0.05), ("lattice", 0.05), ("far", 0.05), ("uniform", 0.3)],
)
def test_dcr_report_bounded_searches_equal_the_full_ones(case, quantile, monkeypatch):
    # above 8 000 records the report searches only up to a bound placed by an exact pilot;
    # its figures must equal those of the full searches bit for bit, whether the bounded
    # search sufficed or fell back to the full one
    from safeaccess.rules.synthetic import distance

    rng = np.random.default_rng(["uniform", "copies", "lattice", "far"].index(case))
    real = rng.random((9000, 5))
    syn = rng.random((8500, 5))
    if case == "copies":
        syn[:3000] = real[:3000]
        real[8000:8500] = real[:500]
    elif case == "lattice":
        real = rng.integers(0, 4, size=(9000, 5)) / 3.0
        syn = rng.integers(0, 4, size=(8500, 5)) / 3.0
    elif case == "far":
        syn = syn + 0.3
    bounded = []
    real_below = distance._kept_below

    def spy(dist, bound):
        bounded.append(bound)
        return real_below(dist, bound)

    monkeypatch.setattr(distance, "_kept_below", spy)
    got = dcr_report(syn, real, quantile=quantile)
    assert got == _report_from_full_searches(syn, real, quantile)
    if case in ("uniform", "far"):
        assert len(bounded) == 2  # both searches were bounded (the point of the change)
