"""synthpop's UiO / repU / DiSCO / Dorig and reproduced full-row uniques: a hand case and a
record-by-record reference on random data."""

from __future__ import annotations

import numpy as np
import pytest

from safeaccess.rules.synthetic import SyntheticCheckError, reproduced_uniques, synthpop_measures


def reference(rk, rt, sk, st):
    """The definitions, one real record at a time."""
    n = len(rk)
    uio = repu = disco = dorig = 0
    for j in range(n):
        same_o = (rk == rk[j]).all(axis=1)
        same_s = (sk == rk[j]).all(axis=1)
        uio += same_o.sum() == 1
        repu += same_o.sum() == 1 and same_s.sum() == 1
        dorig += (rt[same_o] == rt[j]).all()
        disco += same_s.any() and (st[same_s] == rt[j]).all()
    return [100 * x / n for x in (uio, repu, disco, dorig)]


def test_hand_case():
    real_k = np.array([[0, 0], [0, 0], [1, 0], [1, 1], [2, 2]])
    real_t = np.array([0, 1, 1, 0, 1])
    syn_k = np.array([[0, 0], [1, 0], [1, 0], [1, 1], [1, 1], [3, 3]])
    syn_t = np.array([0, 1, 1, 0, 1, 0])
    m = synthpop_measures(real_k, real_t, syn_k, syn_t)
    # uniques in O: (1,0), (1,1), (2,2) -> 3/5; also unique in S: none ((1,0)x2, (1,1)x2, (2,2)x0)
    # Dorig: (0,0) has targets {0,1} -> no; the three uniques -> yes: 3/5
    # DiSCO: r0 (0,0) S {0} = 0 -> yes; r1 (0,0) S {0} != 1 -> no; r2 (1,0) S {1,1} = 1 -> yes;
    #        r3 (1,1) S {0,1} -> no; r4 not in S -> no: 2/5
    assert m.UiO == pytest.approx(60.0)
    assert m.repU == pytest.approx(0.0)
    assert m["Dorig"] == pytest.approx(60.0)
    assert m.DiSCO == pytest.approx(40.0)
    # with S = O every unique is replicated
    same = synthpop_measures(real_k, real_t, real_k, real_t)
    assert same.repU == pytest.approx(60.0) and same.DiSCO == pytest.approx(same.Dorig)


@pytest.mark.parametrize("seed", range(25))
def test_matches_reference(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 4))
    rk = rng.integers(0, 3, size=(int(rng.integers(1, 40)), k))
    sk = rng.integers(0, 3, size=(int(rng.integers(1, 40)), k))
    rt = rng.integers(0, 2, size=len(rk))
    st = rng.integers(0, 2, size=len(sk))
    m = synthpop_measures(rk, rt, sk, st)
    assert [m.UiO, m.repU, m.DiSCO, m.Dorig] == pytest.approx(reference(rk, rt, sk, st))


def test_reproduced_uniques():
    real = np.array([[0, 0, 1], [0, 0, 1], [1, 2, 3], [4, 4, 4], [5, 5, 5]])
    syn = np.array([[1, 2, 3], [1, 2, 3], [0, 0, 1], [5, 5, 6]])
    r = reproduced_uniques(real, syn)
    # uniques: (1,2,3), (4,4,4), (5,5,5); only (1,2,3) occurs in S
    assert (r.real_uniques, r.reproduced) == (3, 1)
    assert r.share == pytest.approx(1 / 3)
    assert reproduced_uniques(real, real).share == 1.0


def test_errors():
    with pytest.raises(SyntheticCheckError, match="2 columns but syn_keys has 1"):
        synthpop_measures(np.zeros((2, 2)), [0, 0], np.zeros((2, 1)), [0, 0])
    with pytest.raises(SyntheticCheckError, match="real_target must be a vector"):
        synthpop_measures(np.zeros((2, 2)), [0], np.zeros((2, 2)), [0, 0])
    with pytest.raises(SyntheticCheckError, match="integer codes"):
        synthpop_measures(np.full((1, 1), 0.5), [0], np.zeros((1, 1)), [0])


def test_row_ids_are_the_rank_of_each_row_among_the_distinct_rows() -> None:
    from safeaccess.rules.synthetic.coding import row_ids

    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 4, (50, 3)), rng.integers(0, 4, (30, 3))
    distinct = sorted({tuple(r) for r in np.concatenate([a, b]).tolist()})
    rank = {row: i for i, row in enumerate(distinct)}
    ids_a, ids_b = row_ids(a, b)
    assert ids_a.tolist() == [rank[tuple(r)] for r in a.tolist()]
    assert ids_b.tolist() == [rank[tuple(r)] for r in b.tolist()]
    # negative codes (float bit patterns) take the general path, with the same meaning
    neg_a, neg_b = row_ids(a - 2, b - 2)
    assert neg_a.tolist() == ids_a.tolist() and neg_b.tolist() == ids_b.tolist()
