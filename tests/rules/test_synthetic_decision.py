"""The attack check end to end (identity release on CMC reproduces the design note's calibration),
the paired bootstrap against index resampling, key-set choice, and the synth_* rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from safeaccess.rules.synthetic import (
    AttackRow,
    AttackSummary,
    DcrReport,
    Interval,
    SampledCoverage,
    SyntheticCheckError,
    SynthRules,
    UniquesExcess,
    attack_check,
    decide,
    key_sets,
    paired_bootstrap,
)

CMC = Path(__file__).resolve().parents[1] / "vectors" / "cmc" / "contraceptive.csv"
S1_QI, METHOD = [0, 1, 2, 3, 4, 5, 6], 9
S2_QI, HEDU = [0, 1, 3, 4, 5], 2


@pytest.fixture(scope="module")
def cmc():
    raw = np.loadtxt(CMC, delimiter=",", comments="#", dtype=np.int64)
    cols = [np.unique(raw[:, c], return_inverse=True) for c in range(raw.shape[1])]
    return np.stack([inv for _, inv in cols], axis=1), [len(v) for v, _ in cols]


def test_identity_release_excess_matches_the_calibration_table(cmc):
    coded, levels = cmc
    # S = O: GCAP is resubstitution; the note's table gives +36.4 (S1 KL6) and +18.4 (S2 KL4)
    rows = attack_check(coded, coded, levels, S1_QI, [METHOD], lengths=[3, 6], max_keysets=50)
    kl6 = [r for r in rows if len(r.keys) == 6]
    assert len(kl6) == 7
    # the note's table is against the LOO attack on the key set itself
    plain = [r.synthetic.gcap_accuracy - r.loo.gcap_accuracy for r in kl6]
    assert round(100 * np.mean(plain), 1) == 36.4
    # the reference is the best back-off LOO attack, never below the key set's own
    assert all(r.reference_accuracy >= r.loo.gcap_accuracy for r in rows)
    assert all(r.excess.estimate <= p + 1e-12 for r, p in zip(kl6, plain, strict=True))
    assert np.mean([r.excess.estimate for r in kl6]) > 0.30
    # resubstitution accuracy is the paper's 84.0 (Table 2, Original)
    assert round(100 * np.mean([r.synthetic.gcap_accuracy for r in kl6]), 1) == 84.0
    rows2 = attack_check(coded, coded, levels, S2_QI, [HEDU], lengths=[2, 4], max_keysets=50)
    kl4 = [r for r in rows2 if len(r.keys) == 4]
    plain4 = [r.synthetic.gcap_accuracy - r.loo.gcap_accuracy for r in kl4]
    assert round(100 * np.mean(plain4), 1) == 18.4
    verdict = decide(SynthRules(), attack=rows)
    assert verdict.action == "withhold"
    assert any(o.rule == "synth_attack_excess_withhold" for o in verdict.outcomes)


def test_independent_columns_do_not_leak(cmc):
    coded, levels = cmc
    rng = np.random.default_rng(5)
    shuffled = np.stack([rng.permutation(coded[:, c]) for c in range(coded.shape[1])], axis=1)
    rows = attack_check(coded, shuffled, levels, S2_QI, [HEDU], lengths=[4])
    assert all(r.excess.estimate < 0 for r in rows if len(r.keys) == 4)
    assert decide(SynthRules(), attack=rows).action != "withhold"


def test_key_sets():
    assert key_sets([3, 5, 7]) == [(3, 5), (3, 7), (5, 7), (3, 5, 7)]
    sets = key_sets(range(10), max_per_length=4, seed=1)
    by_len = {n: [s for s in sets if len(s) == n] for n in (2, 5, 10)}
    assert [len(v) for v in by_len.values()] == [4, 4, 1]
    assert all(len(set(v)) == len(v) for v in by_len.values())
    assert sets == key_sets(range(10), max_per_length=4, seed=1)  # reproducible
    assert key_sets([1, 2, 3], lengths=[1]) == [(1,), (2,), (3,)]
    with pytest.raises(SyntheticCheckError, match="at least one key"):
        key_sets([])
    with pytest.raises(SyntheticCheckError, match=r"lengths must lie in 1..3"):
        key_sets([1, 2, 3], lengths=[4])


def test_paired_bootstrap_matches_index_resampling():
    rng = np.random.default_rng(0)
    a = rng.random(300) < 0.6
    b = rng.random(300) < 0.5
    iv = paired_bootstrap(a, b, resamples=4000, seed=1)
    assert iv.estimate == pytest.approx(a.mean() - b.mean())
    idx = rng.integers(0, 300, size=(4000, 300))
    ref = a[idx].mean(axis=1) - b[idx].mean(axis=1)
    lo, hi = np.quantile(ref, [0.025, 0.975])
    assert iv.low == pytest.approx(lo, abs=0.01) and iv.high == pytest.approx(hi, abs=0.01)
    same = paired_bootstrap(a, a)
    assert (same.estimate, same.low, same.high) == (0.0, 0.0, 0.0)


def _summary(acc: float) -> AttackSummary:
    return AttackSummary(acc, acc, acc, 0, 1.0, acc, 0.4, 0.5, 0.0)


def _row(est, low, high, n=1000, cc=0.0):
    return AttackRow(0, (1, 2), _summary(0.5), _summary(0.5), Interval(est, low, high), cc, n)


@pytest.mark.parametrize(
    ("row", "action"),
    [
        (_row(0.05, 0.01, 0.09), "withhold"),
        (_row(0.05, -0.01, 0.11), "release"),  # not significant, large n
        (_row(0.03, 0.005, 0.06), "review"),
        (_row(0.01, -0.02, 0.05, n=300), "review"),  # small n, upper bound reaches 0.05
        (_row(0.01, -0.02, 0.04, n=300), "release"),
        (_row(-0.1, -0.2, 0.0, cc=0.06), "withhold"),  # certain-correct excess
    ],
)
def test_attack_rules(row, action):
    assert decide(SynthRules(), attack=[row]).action == action


def _dcr(p_syn, p_ref, z):
    return DcrReport(0.0, 0.1, {}, 0.05, p_syn, p_ref, z, 0.0)


def _uniques(excess, low):
    return UniquesExcess(100, 0.1 + excess, 0.1, Interval(excess, low, excess + 0.02))


def test_identity_distance_and_coverage_rules():
    rules = SynthRules()
    # reproduced uniques: the excess over the split-half reference, its lower bound above 0
    assert decide(rules, uniques=_uniques(0.009, 0.001)).action == "release"
    assert decide(rules, uniques=_uniques(0.01, 0.001)).action == "review"
    assert decide(rules, uniques=_uniques(0.03, 0.001)).action == "withhold"
    assert decide(rules, uniques=_uniques(0.08, -0.001)).action == "release"  # CI covers 0
    assert decide(rules, dcr=_dcr(0.08, 0.05, 4.0)).action == "review"
    assert decide(rules, dcr=_dcr(0.08, 0.05, 2.0)).action == "release"  # not significant
    assert decide(rules, dcr=_dcr(0.10, 0.05, 4.0)).action == "withhold"
    assert decide(rules, dcr=_dcr(0.20, 0.05, 1.0)).action == "release"  # not significant
    cov = SampledCoverage(100, (0.2, 0.1, 0.15), 0.15, 0.2, 0.3, False)
    assert decide(rules, coverage=cov).action == "review"
    # ties at the LOO quantile: 21 % of real records lie within y of another (p_ref 0.21), so p
    # rises by 0.21 - 0.05 to 0.26; a mean p' of 0.15 passes, 0.27 does not
    assert decide(rules, coverage=cov, dcr=_dcr(0.0, 0.21, -9.0)).action == "release"
    cov27 = SampledCoverage(100, (0.27, 0.27, 0.27), 0.27, 0.27, 0.3, False)
    assert decide(rules, coverage=cov27, dcr=_dcr(0.0, 0.21, -9.0)).action == "review"
    # without ties (p_ref at the quantile, 0.05) p stays 0.10
    assert decide(rules, coverage=cov, dcr=_dcr(0.0, 0.05, -9.0)).action == "review"
    # a check that could not run never releases
    assert decide(rules, check_error="time limit").action == "review"
    strict = SynthRules(synth_action_on_check_error="withhold")
    assert decide(strict, check_error="time limit").action == "withhold"
    with pytest.raises(SyntheticCheckError, match="never release"):
        SynthRules(synth_action_on_check_error="release")  # type: ignore[arg-type]
    with pytest.raises(SyntheticCheckError, match="must not exceed"):
        SynthRules(synth_attack_excess_review=0.1)


def test_rules_from_a_settings_mapping():
    rules = SynthRules.from_mapping({"synth_attack_excess_withhold": 0.08, "synth_max_keysets": 5})
    assert rules.synth_attack_excess_withhold == 0.08 and rules.synth_max_keysets == 5
    assert rules.synth_attack_excess_review == 0.02  # untouched keys keep the defaults
    assert SynthRules.from_mapping({}) == SynthRules()
    with pytest.raises(SyntheticCheckError, match="unknown setting 'synth_colour'"):
        SynthRules.from_mapping({"synth_colour": 1})
    with pytest.raises(SyntheticCheckError, match="synth_max_keysets: 'many'"):
        SynthRules.from_mapping({"synth_max_keysets": "many"})
    with pytest.raises(SyntheticCheckError, match="synth_yp_y"):
        SynthRules.from_mapping({"synth_yp_y": "median"})


def _features(coded, levels):
    from safeaccess.rules.synthetic import distance_features

    # age (col 0) and children (col 3) numeric within their coded range, the rest categorical
    spec = [(0.0, levels[c] - 1.0) if c in (0, 3) else levels[c] for c in range(coded.shape[1])]
    return distance_features(coded, spec)


def test_run_checks_identity_withholds_and_independent_columns_release(cmc):
    from safeaccess.rules.synthetic import run_checks, verdict

    coded, levels = cmc
    feats = _features(coded, levels)
    same = run_checks(coded, coded, levels, S2_QI, [HEDU], real_features=feats, syn_features=feats)
    assert same.reproduced.share == 1.0 and same.dcr.p_syn == 1.0
    # the design note's calibration: 1 381 of 1 473 records are full-row uniques, and p_ref =
    # 0.062 (the LOO 5 % quantile is 0: exactly the records with a duplicate lie at or below it)
    assert same.reproduced.real_uniques == 1381
    assert round(same.dcr.p_ref, 3) == 0.062
    assert same.synthpop[HEDU].repU == pytest.approx(same.synthpop[HEDU].UiO)
    fired = {o.rule for o in verdict(same).outcomes}
    assert verdict(same).action == "withhold"
    assert {
        "synth_attack_excess_withhold",
        "synth_full_row_uniques_withhold",
        "synth_dcr_close_withhold",
        "synth_yp_p",
    } <= fired

    rng = np.random.default_rng(11)
    shuffled = np.stack([rng.permutation(coded[:, c]) for c in range(coded.shape[1])], axis=1)
    indep = run_checks(
        coded,
        shuffled,
        levels,
        S2_QI,
        [HEDU],
        real_features=feats,
        syn_features=_features(shuffled, levels),
    )
    assert indep.reproduced.share < 0.05
    assert indep.dcr.p_syn < indep.dcr.p_ref
    assert verdict(indep).action == "release", verdict(indep).outcomes
    assert indep.p_privacy.f_size >= 1 and 0.0 <= indep.p_privacy.p <= 1.0
