"""MST-G release: the tree picked from noisy pair scores finds the true chain, the charge is
exactly mu^2, and the noisy total replaces the true count."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest

from safeaccess.rules.synthetic import SyntheticCheckError, max_spanning_tree, pair_scores
from safeaccess.server.synth.release import mst_release

LEVELS = [3, 4, 3, 2, 5]


def chain(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cols = [rng.integers(0, LEVELS[0], n)]
    for lv in LEVELS[1:]:
        cols.append(np.where(rng.random(n) < 0.8, cols[-1] % lv, rng.integers(0, lv, n)))
    return np.stack(cols, axis=1)


def tables(data):
    one = [np.bincount(data[:, c], minlength=LEVELS[c]).astype(float) for c in range(len(LEVELS))]
    pairs = {}
    for a, b in combinations(range(len(LEVELS)), 2):
        flat = data[:, a] * LEVELS[b] + data[:, b]
        pairs[(a, b)] = np.bincount(flat, minlength=LEVELS[a] * LEVELS[b]).astype(float)
    return one, pairs


def test_release_finds_the_chain_and_charges_mu_squared():
    data = chain(20_000, 0)
    one, pairs = tables(data)
    rel = mst_release(one, pairs, mu=1.0, records_per_unit=2)
    assert sorted(rel.tree) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert rel.charge == pytest.approx(1.0, rel=1e-12)
    s1, ss, s2 = rel.sigmas
    # hand: d = 5 one-ways, P = 10 scores, K = 4 tree marginals, m = 2
    assert s1 == pytest.approx(2 * math.sqrt(5) / math.sqrt(0.25))
    assert ss == pytest.approx(2 * math.sqrt(10) / math.sqrt(0.10))
    assert s2 == pytest.approx(2 * math.sqrt(4) / math.sqrt(0.65))
    assert abs(rel.total - 20_000) < 6 * rel.total_sd
    assert [t.size for t in rel.noisy_tree] == [LEVELS[a] * LEVELS[b] for a, b in rel.tree]


def test_pair_scores_and_kruskal_by_hand():
    # independent 2x2 table scores 0; a diagonal one scores |50-25|*4 = 100
    one = [np.array([50.0, 50.0])] * 3
    scores = pair_scores(
        [
            np.array([[25, 25], [25, 25]]),
            np.array([[50, 0], [0, 50]]),
            np.array([[40, 10], [10, 40]]),
        ],
        [(0, 1), (0, 2), (1, 2)],
        one,
        100.0,
    )
    assert scores.tolist() == [0.0, 100.0, 60.0]
    assert max_spanning_tree(3, [(0, 1), (0, 2), (1, 2)], scores) == [(0, 2), (1, 2)]
    # ties keep the pairs' order; a cycle-closing pair is skipped
    assert max_spanning_tree(3, [(0, 1), (1, 2), (0, 2)], [1.0, 1.0, 1.0]) == [(0, 1), (1, 2)]
    with pytest.raises(SyntheticCheckError, match="table has 3 cells"):
        pair_scores([np.zeros(3)], [(0, 1)], one, 100.0)


def test_release_needs_every_pair():
    one, pairs = tables(chain(100, 1))
    del pairs[(0, 4)]
    with pytest.raises(SyntheticCheckError, match=r"missing for pairs \[\(0, 4\)\]"):
        mst_release(one, pairs, mu=1.0)
