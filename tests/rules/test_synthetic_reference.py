"""The references the synthetic-data checks compare against, on cases worked out by hand.

- The attack's reference is the best leave-one-out (LOO) attacker over the key set and its
  back-off subsets, down to no key (the majority of everyone else): GCAP's vote in a real key
  cell of two records with different targets predicts each one wrong, below that majority.
- A certain attribution counts only where the real key cell is as pure: a synthesiser that makes
  a mixed real cell pure in its majority class is right there only at the cell's real rate.
- Reproduced full-row uniques are compared with a split-half reference.
"""

from __future__ import annotations

import numpy as np
import pytest

from safeaccess.rules.synthetic import SynthRules, attack_check, decide, uniques_excess
from safeaccess.rules.synthetic.attack import backoff_subsets, loo_zero_rule


def test_backoff_subsets_cover_none_each_key_and_each_key_set_less_one() -> None:
    assert backoff_subsets([4]) == [()]
    assert backoff_subsets([1, 2]) == [(), (1,), (2,)]
    assert backoff_subsets([1, 2, 3]) == [(), (1,), (2,), (3,), (2, 3), (1, 3), (1, 2)]
    four = backoff_subsets([1, 2, 3, 4])
    assert len(four) == 1 + 4 + 4 and (1, 2, 3, 4) not in four and (1, 2) not in four


def test_loo_zero_rule_leaves_the_victim_out() -> None:
    # targets 0, 0, 1: without record 0 the others are one 0 and one 1
    assert loo_zero_rule([0, 0, 1], 2).tolist() == [[1, 1], [1, 1], [2, 0]]


def test_a_synthesiser_at_the_majority_shows_no_excess_over_sparse_real_cells() -> None:
    # one key (3 levels), binary target; the real cells of keys 0 and 1 hold one record of each
    # target, key 2 two records of target 0
    real = np.array([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 0]])
    # the synthetic data say target 0 everywhere: GCAP is right for the four records of target 0
    syn = np.array([[0, 0], [1, 0], [2, 0]])
    (row,) = attack_check(real, syn, [3, 2], keys=[0], targets=[1], lengths=[1])
    assert row.synthetic.gcap_accuracy == pytest.approx(4 / 6)
    # LOO on the key: in cells 0 and 1 the other record holds the other target, so the four
    # records there are guessed wrong; in cell 2 both right: 2 of 6
    assert row.loo.gcap_accuracy == pytest.approx(2 / 6)
    # LOO majority: without a target-0 record the others are three 0s and two 1s (right); without
    # a target-1 record four 0s and one 1 (wrong): 4 of 6, the best back-off
    assert row.reference_keys == ()
    assert row.reference_accuracy == pytest.approx(4 / 6)
    # the same records right and wrong on both sides: no excess, and a zero-width interval
    assert (row.excess.estimate, row.excess.low, row.excess.high) == (0.0, 0.0, 0.0)
    assert decide(SynthRules(), attack=[row]).action == "release"


def _cells(spec: list[tuple[int, int, int]]) -> np.ndarray:
    """Records (key, target) from (key, target, how many)."""
    return np.array([[k, t] for k, t, n in spec for _ in range(n)])


def test_certain_correct_needs_the_real_cell_to_be_pure_too() -> None:
    # key 0: 6 records of target 0 and 4 of target 1 (60 % pure); key 1: 3 records of target 1;
    # key 2: 2 records of target 0
    real = _cells([(0, 0, 6), (0, 1, 4), (1, 1, 3), (2, 0, 2)])
    # LOO: certain (>= 90 %, >= 2 others, right) only in key 1 (two others, both 1): 3 of 15
    # A noisy model makes key 0 pure in its majority: 10 synthetic records of target 0
    syn = _cells([(0, 0, 10), (1, 1, 3), (2, 0, 2)])
    (row,) = attack_check(real, syn, [3, 2], keys=[0], targets=[1], lengths=[1])
    # the six target-0 records of key 0 are "certain and right" on S, but their real cell is
    # 60 % pure: they do not count. Keys 1 and 2 count on S (5 of 15); the LOO attacker is
    # certain in key 1 only (key 2 leaves one other record): excess (5 - 3) / 15
    assert row.certain_correct_excess == pytest.approx(2 / 15)
    assert row.synthetic.certain_correct_rate == pytest.approx(11 / 15)  # the raw attacker
    assert row.loo.certain_correct_rate == pytest.approx(3 / 15)
    # the identity release: certain where the real cell is pure: keys 1 and 2, the same 2 / 15
    (same,) = attack_check(real, real, [3, 2], keys=[0], targets=[1], lengths=[1])
    assert same.certain_correct_excess == pytest.approx(2 / 15)


def test_uniques_excess_against_the_other_half() -> None:
    distinct = np.arange(40).reshape(20, 2)
    # every real row twice: a row unique within one half has its twin in the other half, so the
    # other half reproduces all of them; synthetic rows that occur nowhere in O reproduce none
    twins = np.concatenate([distinct[:10], distinct[:10]])
    out = uniques_excess(twins, distinct[10:] + 100, seed=3)
    assert out.uniques > 0
    assert (out.syn_share, out.ref_share, out.excess.estimate) == (0.0, 1.0, -1.0)
    # 20 distinct real rows: all are unique within their half (20 in all, over both folds) and
    # none occurs in the other half. S = 10 copies of real row 0 (as many rows as a half, so
    # all of S is used): row 0 is reproduced in the fold where it is in A, once of 20
    out = uniques_excess(distinct, np.repeat(distinct[:1], 10, axis=0), seed=3)
    assert (out.uniques, out.ref_share) == (20, 0.0)
    assert out.syn_share == pytest.approx(1 / 20) and out.excess.estimate == pytest.approx(1 / 20)
    # different seeds split differently; the shares here do not depend on the split
    assert uniques_excess(distinct, np.repeat(distinct[:1], 10, axis=0), seed=4).syn_share == (
        pytest.approx(1 / 20)
    )
