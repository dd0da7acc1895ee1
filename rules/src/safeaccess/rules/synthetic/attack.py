"""The attribute-disclosure check: GCAP per target x key set against the leave-one-out reference.

The reference is the same attack run on the real data without the victim: what anyone learns
about a person from everyone else's records (population-level inference a release may carry).
An attacker who knows the keys of a key set may also ignore some of them, so the reference is the
best of the leave-one-out attacks on the key set and on its back-off subsets (each key alone, the
key set less one key, and no key at all: the majority of everyone else). GCAP's majority vote in
a sparse real key cell without the victim can fall below that majority (a cell of two records
with different targets predicts each one wrong), and a smooth synthesiser reaching the majority
would otherwise show as an excess. The excess of the synthetic-data attack over the reference is
what the release adds; a paired bootstrap over the real records gives its interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from safeaccess.rules.synthetic.coding import coded_matrix, levels_checked
from safeaccess.rules.synthetic.errors import SyntheticCheckError
from safeaccess.rules.synthetic.gcap import gcap, gcap_loo
from safeaccess.rules.synthetic.summary import (
    CERTAIN_SCORE,
    AttackSummary,
    attack_summary,
    certain_correct,
    correct,
)

DEFAULT_RESAMPLES = 200
DEFAULT_MAX_KEYSETS = 20


@dataclass(frozen=True)
class Interval:
    """A difference of two paired proportions and its percentile bootstrap interval."""

    estimate: float
    low: float
    high: float


@dataclass(frozen=True)
class AttackRow:
    """One (target, key set): the synthetic-data attack, its LOO reference and the excess."""

    target: int
    keys: tuple[int, ...]
    synthetic: AttackSummary
    loo: AttackSummary
    excess: Interval
    certain_correct_excess: float
    n_real: int
    # the reference attacker: the key subset (of `keys`) whose LOO accuracy was highest
    reference_keys: tuple[int, ...] = ()
    reference_accuracy: float = float("nan")


def paired_bootstrap(
    a: ArrayLike,
    b: ArrayLike,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """mean(a) - mean(b) for paired 0/1 outcomes, with a percentile interval over `resamples`
    resamples of the records.

    A resample's difference depends only on how many drawn records have a - b = +1 and -1, so each
    resample is one multinomial draw over those three classes: the same distribution as drawing n
    indices, in O(resamples) instead of O(resamples * n) memory.
    """
    x = np.asarray(a, dtype=bool)
    y = np.asarray(b, dtype=bool)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise SyntheticCheckError(
            f"paired outcomes must be two non-empty vectors of one length, got {x.shape}, {y.shape}"
        )
    if resamples < 1:
        raise SyntheticCheckError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise SyntheticCheckError(f"level must lie strictly between 0 and 1, got {level}")
    n = x.size
    up = int((x & ~y).sum())
    down = int((~x & y).sum())
    probs = np.array([up, down, n - up - down], dtype=np.float64) / n
    draws = np.random.default_rng(seed).multinomial(n, probs, size=resamples)
    diffs = (draws[:, 0] - draws[:, 1]) / n
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(diffs, [tail, 1.0 - tail])
    return Interval((up - down) / n, float(low), float(high))


def key_sets(
    keys: Sequence[int],
    *,
    max_per_length: int = DEFAULT_MAX_KEYSETS,
    seed: int = 0,
    lengths: Sequence[int] | None = None,
) -> list[tuple[int, ...]]:
    """Key sets of lengths {2, ceil(q/2), q} (or `lengths`) over the q key columns; a length
    with more than `max_per_length` subsets gets that many distinct ones drawn with `seed`."""
    cols = tuple(dict.fromkeys(int(k) for k in keys))
    q = len(cols)
    if q == 0:
        raise SyntheticCheckError("the attack needs at least one key column")
    if max_per_length < 1:
        raise SyntheticCheckError(f"max_per_length must be >= 1, got {max_per_length}")
    wanted = {min(2, q), math.ceil(q / 2), q} if lengths is None else set(lengths)
    if any(not 1 <= n <= q for n in wanted):
        raise SyntheticCheckError(f"key-set lengths must lie in 1..{q}, got {sorted(wanted)}")
    rng = np.random.default_rng(seed)
    out: list[tuple[int, ...]] = []
    for length in sorted(wanted):
        if math.comb(q, length) <= max_per_length:
            out.extend(combinations(cols, length))
            continue
        chosen: set[tuple[int, ...]] = set()
        while len(chosen) < max_per_length:
            pick = np.sort(rng.choice(q, size=length, replace=False))
            chosen.add(tuple(cols[i] for i in pick))
        out.extend(sorted(chosen))
    return out


def attack_check(
    real: ArrayLike,
    syn: ArrayLike,
    levels: Sequence[int],
    keys: Sequence[int],
    targets: Sequence[int],
    *,
    max_keysets: int = DEFAULT_MAX_KEYSETS,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    lengths: Sequence[int] | None = None,
) -> list[AttackRow]:
    """GCAP and its LOO reference for every target and key set (targets removed from the keys).

    `real` and `syn` are coded matrices (records x columns) with column i in 0..levels[i]-1;
    `keys` and `targets` are column indices. `seed` fixes the key-set draw and the bootstrap;
    `lengths` replaces the default key-set lengths {2, ceil(q/2), q}.
    """
    lv = levels_checked(levels)
    o = coded_matrix(real, lv, "real")
    s = coded_matrix(syn, lv, "syn")
    for name, cols in (("keys", keys), ("targets", targets)):
        bad = [c for c in cols if not 0 <= int(c) < len(lv)]
        if bad:
            raise SyntheticCheckError(f"{name} {bad} are not column indices 0..{len(lv) - 1}")
    if not targets:
        raise SyntheticCheckError("the attack needs at least one target column")
    rows: list[AttackRow] = []
    for t in dict.fromkeys(int(t) for t in targets):
        cols = [int(k) for k in keys if int(k) != t]
        cache: dict[tuple[int, ...], NDArray[np.bool_]] = {}  # LOO hits per key subset
        for ks in key_sets(cols, max_per_length=max_keysets, seed=seed, lengths=lengths):
            rows.append(_one_attack(o, s, lv, list(ks), t, resamples, seed, cache))
    return rows


def backoff_subsets(keys: Sequence[int]) -> list[tuple[int, ...]]:
    """The key subsets the reference attacker may fall back on: none, each key alone and the
    key set less one key (all subsets for up to 3 keys), without the key set itself."""
    ks = tuple(keys)
    out: dict[tuple[int, ...], None] = {(): None}
    for k in ks:
        out[(k,)] = None
    if len(ks) > 2:
        for drop in range(len(ks)):
            out[ks[:drop] + ks[drop + 1 :]] = None
    out.pop(ks, None)
    return list(out)


def loo_zero_rule(target: ArrayLike, target_levels: int) -> NDArray[np.int64]:
    """Counts of the LOO attacker that knows no key: every other record's target."""
    t = np.asarray(target, dtype=np.int64)
    if t.size < 2:
        raise SyntheticCheckError("the leave-one-out reference needs at least 2 records")
    counts = np.tile(np.bincount(t, minlength=target_levels), (t.size, 1))
    counts[np.arange(t.size), t] -= 1
    return counts


def real_cell_pure(
    loo_counts: ArrayLike, loo_rho: ArrayLike, target: ArrayLike
) -> NDArray[np.bool_]:
    """Whether each real record's key cell in O (the record included) holds its target in at
    least CERTAIN_SCORE of its records: the real data confirm a certain attribution.

    From `gcap_loo`'s output, without another search: at rho = 0 the cell is the other records
    at distance 0 plus the record itself; at rho > 0 the record is alone in its cell (pure)."""
    counts = np.asarray(loo_counts, dtype=np.int64)
    t = np.asarray(target, dtype=np.int64)
    own = counts[np.arange(t.size), t] + 1
    pure = own >= CERTAIN_SCORE * (counts.sum(axis=1) + 1)
    return np.asarray(pure | (np.asarray(loo_rho) > 0))


def _one_attack(
    o: NDArray[np.int64],
    s: NDArray[np.int64],
    lv: list[int],
    ks: list[int],
    t: int,
    resamples: int,
    seed: int,
    cache: dict[tuple[int, ...], NDArray[np.bool_]],
) -> AttackRow:
    key_lv = [lv[i] for i in ks]
    target = o[:, t]
    counts, rho = gcap(o[:, ks], target, s[:, ks], s[:, t], key_lv, lv[t])
    l_counts, l_rho = gcap_loo(o[:, ks], target, key_lv, lv[t])
    syn_summary = attack_summary(counts, rho, target, s[:, t], lv[t])
    # the LOO attacker's zero rule is the real mode: its "synthetic data" is the real data
    loo_summary = attack_summary(l_counts, l_rho, target, target, lv[t])
    ref_keys, ref_hits = tuple(ks), correct(l_counts, target)
    for sub in backoff_subsets(ks):
        if sub not in cache:
            if sub:
                sub_counts, _ = gcap_loo(o[:, list(sub)], target, [lv[i] for i in sub], lv[t])
            else:
                sub_counts = loo_zero_rule(target, lv[t])
            cache[sub] = correct(sub_counts, target)
        if cache[sub].mean() > ref_hits.mean():
            ref_keys, ref_hits = sub, cache[sub]
    excess = paired_bootstrap(correct(counts, target), ref_hits, resamples=resamples, seed=seed)
    # A certain attribution discloses only where the real key cell is as pure as the synthetic
    # one: a noisy model that makes a key cell pure in the majority class is certain and right
    # only at the cell's real rate. The LOO attacker's certainty implies a pure real cell.
    confirmed = real_cell_pure(l_counts, l_rho, target)
    cc = float(
        (certain_correct(counts, rho, target) & confirmed).mean()
        - certain_correct(l_counts, l_rho, target).mean()
    )
    return AttackRow(
        t,
        tuple(ks),
        syn_summary,
        loo_summary,
        excess,
        cc,
        o.shape[0],
        ref_keys,
        float(ref_hits.mean()),
    )
