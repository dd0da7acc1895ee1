"""GCAP (Hittmeir Alg. 3.1) by shells against a brute force over all record pairs, hand cases for
ties, the leave-one-out reference, and Hittmeir's published "Original" rows on the CMC data."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from safeaccess.rules.synthetic import (
    SyntheticCheckError,
    attack_summary,
    gcap,
    gcap_loo,
    predict,
)

CMC = Path(__file__).resolve().parents[1] / "vectors" / "cmc" / "contraceptive.csv"


def brute_gcap(rk, rt, sk, st, t_levels, *, loo=False):
    """Alg. 3.1 record by record: Hamming distance to every synthetic record."""
    counts = np.zeros((len(rk), t_levels), dtype=np.int64)
    rho = np.zeros(len(rk), dtype=np.int64)
    for j in range(len(rk)):
        dist = (sk != rk[j]).sum(axis=1)
        if loo:
            dist = dist.astype(float)
            dist[j] = np.inf
        r = dist.min()
        near = dist == r
        rho[j] = int(r)
        counts[j] = np.bincount(st[near], minlength=t_levels)
    return counts, rho


def random_case(rng, n_real, n_syn, levels, t_levels):
    rk = np.stack([rng.integers(0, lv, n_real) for lv in levels], axis=1)
    sk = np.stack([rng.integers(0, lv, n_syn) for lv in levels], axis=1)
    return rk, rng.integers(0, t_levels, n_real), sk, rng.integers(0, t_levels, n_syn)


# ---- hand cases ---------------------------------------------------------------------------


def test_hand_example_exact_match_near_match_and_ties():
    # keys (a, b); synthetic records:
    #   (0,0)->1, (0,0)->2, (0,1)->0, (1,1)->0, (1,1)->1, (2,2)->2
    syn_k = np.array([[0, 0], [0, 0], [0, 1], [1, 1], [1, 1], [2, 2]])
    syn_t = np.array([1, 2, 0, 0, 1, 2])
    real_k = np.array([[0, 0], [1, 0], [2, 1], [3, 3]])
    real_t = np.array([2, 0, 2, 1])
    counts, rho = gcap(real_k, real_t, syn_k, syn_t, [4, 4], 3)
    # (0,0): exact class {1, 2}                          -> rho 0, counts [0,1,1]
    # (1,0): distance 1 to (0,0)x2 and (1,1)x2            -> rho 1, counts [1,2,1]
    # (2,1): distance 1 to (0,1), (1,1)x2 and (2,2)       -> rho 1, counts [2,1,1]
    # (3,3): distance 2 to everything                      -> rho 2, counts [2,2,2]
    assert rho.tolist() == [0, 1, 1, 2]
    assert counts.tolist() == [[0, 1, 1], [1, 2, 1], [2, 1, 1], [2, 2, 2]]
    # majority vote, ties to the lowest level: [0,1,1] -> 1, [2,2,2] -> 0
    assert predict(counts).tolist() == [1, 1, 0, 0]


def test_attack_summary_hand_example():
    syn_k = np.array([[0, 0], [0, 0], [0, 0], [0, 1], [1, 1], [1, 1]])
    syn_t = np.array([1, 1, 1, 0, 0, 1])
    real_k = np.array([[0, 0], [0, 1], [1, 1], [2, 2], [0, 0]])
    real_t = np.array([1, 0, 1, 0, 0])
    counts, rho = gcap(real_k, real_t, syn_k, syn_t, [3, 3], 2)
    # r0 (0,0) exact {1,1,1}: predict 1, correct, score 1, |N|=3 -> certain
    # r1 (0,1) exact {0}: predict 0, correct, score 1, |N|=1 -> not certain
    # r2 (1,1) exact {0,1}: tie -> 0, wrong, score 1/2
    # r3 (2,2) distance 1 to (0,1)? no: (2,2) vs (0,1) differs twice; vs (1,1) twice -> rho 2,
    #    all six: {1:4, 0:2} predict 1, wrong, score 2/6
    # r4 (0,0) exact {1,1,1}: predict 1, wrong (target 0), score 0
    assert rho.tolist() == [0, 0, 0, 2, 0]
    s = attack_summary(counts, rho, real_t, syn_t, 2)
    assert s.gcap_accuracy == pytest.approx(2 / 5)
    assert s["zero_cap_accuracy"] == pytest.approx(2 / 5)
    assert s.icap_accuracy == pytest.approx(2 / 4)
    assert s.non_matches == 1
    assert s.match_rate == pytest.approx(4 / 5)
    assert s.gcap_mean_score == pytest.approx((1 + 1 + 0.5 + 2 / 6 + 0) / 5)
    assert s.zero_rule_accuracy == pytest.approx(2 / 5)  # mode of S is 1
    assert s.random_guess_accuracy == pytest.approx(1 / 2)
    assert s.certain_correct_rate == pytest.approx(1 / 5)
    assert (s["gcap"], s["0cap"], s["icap"]) == (
        s.gcap_accuracy,
        s.zero_cap_accuracy,
        s.icap_accuracy,
    )
    with pytest.raises(KeyError):
        s["colour"]


def test_zero_rule_tie_goes_to_lowest_level_and_icap_without_matches_is_nan():
    counts = np.array([[1, 1]])
    s = attack_summary(counts, np.array([1]), np.array([0]), np.array([0, 1]), 2)
    assert s.zero_rule_accuracy == 1.0  # S has one 0 and one 1: the zero rule guesses 0
    assert math.isnan(s.icap_accuracy)
    assert s.gcap_accuracy == 1.0  # tie -> level 0


def test_loo_hand_example():
    keys = np.array([[0, 0], [0, 0], [0, 1], [2, 2]])
    target = np.array([0, 1, 1, 0])
    counts, rho = gcap_loo(keys, target, [3, 3], 2)
    # r0: the other (0,0) -> {1}; r1: same; r2 (0,1): nearest others at distance 1 {0,1};
    # r3 (2,2): distance 2 to all three others {0,1,1}
    assert rho.tolist() == [0, 0, 1, 2]
    assert counts.tolist() == [[0, 1], [1, 0], [1, 1], [1, 2]]


# ---- brute-force references ---------------------------------------------------------------


@pytest.mark.parametrize("seed", range(60))
def test_gcap_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 6))
    levels = [int(x) for x in rng.integers(1, 6, size=k)]
    t_levels = int(rng.integers(1, 4))
    rk, rt, sk, st = random_case(
        rng, int(rng.integers(1, 40)), int(rng.integers(1, 40)), levels, t_levels
    )
    counts, rho = gcap(rk, rt, sk, st, levels, t_levels)
    b_counts, b_rho = brute_gcap(rk, rt, sk, st, t_levels)
    assert rho.tolist() == b_rho.tolist()
    assert counts.tolist() == b_counts.tolist()


@pytest.mark.parametrize("seed", range(60))
def test_gcap_loo_matches_brute_force(seed):
    rng = np.random.default_rng(1000 + seed)
    k = int(rng.integers(1, 6))
    levels = [int(x) for x in rng.integers(1, 5, size=k)]
    t_levels = int(rng.integers(1, 4))
    rk, rt, _, _ = random_case(rng, int(rng.integers(2, 40)), 1, levels, t_levels)
    counts, rho = gcap_loo(rk, rt, levels, t_levels)
    b_counts, b_rho = brute_gcap(rk, rt, rk, rt, t_levels, loo=True)
    assert rho.tolist() == b_rho.tolist()
    assert counts.tolist() == b_counts.tolist()


def test_wide_keys_fall_back_to_row_grouping():
    # 5 keys of 2**20 levels need 100 bits: too wide to pack into one int64
    rng = np.random.default_rng(7)
    levels = [2**20] * 5
    base = rng.integers(0, 3, size=(30, 5)) * 99_991
    rk, sk = base[:15], base[15:]
    rt, st = rng.integers(0, 3, 15), rng.integers(0, 3, 15)
    counts, rho = gcap(rk, rt, sk, st, levels, 3)
    b_counts, b_rho = brute_gcap(rk, rt, sk, st, 3)
    assert rho.tolist() == b_rho.tolist() and counts.tolist() == b_counts.tolist()
    l_counts, l_rho = gcap_loo(rk, rt, levels, 3)
    bl_counts, bl_rho = brute_gcap(rk, rt, rk, rt, 3, loo=True)
    assert l_rho.tolist() == bl_rho.tolist() and l_counts.tolist() == bl_counts.tolist()


# ---- input errors -------------------------------------------------------------------------


def test_bad_input_is_named():
    k = np.array([[0, 1]])
    with pytest.raises(
        SyntheticCheckError, match=r"syn_keys\[0, 1\] = 5 is outside the levels 0..2"
    ):
        gcap(k, [0], np.array([[0, 5]]), [0], [2, 3], 2)
    with pytest.raises(SyntheticCheckError, match="3 columns but 2 level counts"):
        gcap(np.zeros((1, 3), int), [0], np.zeros((1, 3), int), [0], [2, 2], 2)
    with pytest.raises(SyntheticCheckError, match="no records"):
        gcap(k, [0], np.zeros((0, 2), int), [], [2, 2], 2)
    with pytest.raises(SyntheticCheckError, match="at least 2 records"):
        gcap_loo(k, [0], [2, 2], 2)
    with pytest.raises(SyntheticCheckError, match="real_target"):
        gcap(k, [0, 1], k, [0], [2, 2], 2)


# ---- Hittmeir et al. (2020), Tables 1-4, row "Original" -----------------------------------

# Column positions in the CMC file.
AGE, WEDU, HEDU, CHILDREN, RELIGION, WORKING, HOCC, METHOD = 0, 1, 2, 3, 4, 5, 6, 9
S1_QI = [AGE, WEDU, HEDU, CHILDREN, RELIGION, WORKING, HOCC]  # target: contraceptive method
S2_QI = [AGE, WEDU, CHILDREN, RELIGION, WORKING]  # target: husband's education


@pytest.fixture(scope="module")
def cmc():
    raw = np.loadtxt(CMC, delimiter=",", comments="#", dtype=np.int64)
    # every attribute categorical (age as its 34 distinct values), coded by sorted value
    cols, levels = [], []
    for c in range(raw.shape[1]):
        values, codes = np.unique(raw[:, c], return_inverse=True)
        cols.append(codes)
        levels.append(len(values))
    return raw, np.stack(cols, axis=1), levels


def test_cmc_file_is_the_uci_data(cmc):
    raw, _, _ = cmc
    assert raw.shape == (1473, 10)
    assert raw[0].tolist() == [24, 2, 3, 3, 1, 1, 2, 3, 0, 1]
    assert np.bincount(raw[:, METHOD])[1:].tolist() == [629, 333, 511]
    assert np.bincount(raw[:, HEDU])[1:].tolist() == [44, 178, 352, 899]


def resubstitution(coded, levels, qi, target, length):
    """Accuracy (%) of GCAP with S = O for every key set of `length` keys from `qi`."""
    accs = []
    for ks in itertools.combinations(qi, length):
        ks = list(ks)
        counts, rho = gcap(
            coded[:, ks],
            coded[:, target],
            coded[:, ks],
            coded[:, target],
            [levels[i] for i in ks],
            levels[target],
        )
        assert (rho == 0).all()  # every record matches itself: GCAP = CAP on the original
        accs.append(100 * np.mean(predict(counts) == coded[:, target]))
    return np.array(accs)


@pytest.mark.parametrize(
    ("qi", "target", "length", "n_sets", "mean", "sd"),
    [
        (S1_QI, METHOD, 3, 35, 54.9, 7.8),  # Table 1
        (S1_QI, METHOD, 6, 7, 84.0, 7.4),  # Table 2
        (S2_QI, HEDU, 2, 10, 64.3, 3.1),  # Table 3
        (S2_QI, HEDU, 4, 5, 77.8, 7.0),  # Table 4
    ],
)
def test_hittmeir_original_rows(cmc, qi, target, length, n_sets, mean, sd):
    _, coded, levels = cmc
    accs = resubstitution(coded, levels, qi, target, length)
    assert len(accs) == n_sets
    assert round(float(accs.mean()), 1) == mean
    assert round(float(accs.std()), 1) == sd  # the paper's ± is the population sd over key sets


def test_cmc_loo_matches_brute_force_and_sits_below_resubstitution(cmc):
    _, coded, levels = cmc
    ks = [AGE, WEDU, CHILDREN, RELIGION]
    counts, rho = gcap_loo(coded[:, ks], coded[:, HEDU], [levels[i] for i in ks], levels[HEDU])
    b_counts, b_rho = brute_gcap(
        coded[:, ks], coded[:, HEDU], coded[:, ks], coded[:, HEDU], 4, loo=True
    )
    assert rho.tolist() == b_rho.tolist()
    assert counts.tolist() == b_counts.tolist()
    loo_acc = np.mean(predict(counts) == coded[:, HEDU])
    re_counts, _ = gcap(
        coded[:, ks], coded[:, HEDU], coded[:, ks], coded[:, HEDU], [levels[i] for i in ks], 4
    )
    assert loo_acc < np.mean(predict(re_counts) == coded[:, HEDU])
