"""Accuracy figures of one GCAP attack (Hittmeir Tables 1-5) and its baselines."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from safeaccess.rules.synthetic.coding import coded_vector
from safeaccess.rules.synthetic.errors import SyntheticCheckError
from safeaccess.rules.synthetic.gcap import predict

# "Certain" attribution: an exact key match whose neighbour set is >= 90 % one value and holds
# at least two records (a single matching record is a uniqueness fact, not a certainty).
CERTAIN_SCORE = 0.9
CERTAIN_MIN_SET = 2


_ALIASES = {
    "gcap": "gcap_accuracy",
    "zero_cap": "zero_cap_accuracy",
    "0cap": "zero_cap_accuracy",
    "icap": "icap_accuracy",
}


@dataclass(frozen=True)
class AttackSummary:
    """Fractions over the real records (0..1); `non_matches` is a record count.

    Readable as attributes or as a mapping (`summary["gcap_accuracy"]`).
    """

    gcap_accuracy: float
    zero_cap_accuracy: float
    icap_accuracy: float  # NaN when no real key occurs in S (ICAP has no records then)
    non_matches: int
    match_rate: float
    gcap_mean_score: float
    zero_rule_accuracy: float
    random_guess_accuracy: float
    certain_correct_rate: float

    def __getitem__(self, name: str) -> Any:
        # "gcap", "zero_cap", "0cap" and "icap" name the accuracies as the papers' tables do
        key = _ALIASES.get(name, name)
        if key not in self.__dataclass_fields__:
            raise KeyError(name)
        return getattr(self, key)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def correct(counts: ArrayLike, real_target: ArrayLike) -> NDArray[np.bool_]:
    """Whether the majority vote of each neighbour set hits the real target."""
    arr = np.asarray(counts)
    return predict(arr) == coded_vector(real_target, arr.shape[1], "real_target")


def scores(counts: ArrayLike, real_target: ArrayLike) -> NDArray[np.float64]:
    """GCAP_{s,j}: the share of the neighbour set N_j holding record j's real target."""
    arr = np.asarray(counts, dtype=np.int64)
    target = coded_vector(real_target, arr.shape[1], "real_target")
    sizes = arr.sum(axis=1)
    if np.any(sizes <= 0):
        raise SyntheticCheckError("every neighbour set must be non-empty (counts rows sum to 0)")
    return arr[np.arange(arr.shape[0]), target] / sizes


def certain_correct(counts: ArrayLike, rho: ArrayLike, real_target: ArrayLike) -> NDArray[np.bool_]:
    """rho = 0, score >= 0.9, |N| >= 2 and the prediction correct, per real record."""
    arr = np.asarray(counts, dtype=np.int64)
    distance = np.asarray(rho)
    return (
        (distance == 0)
        & (scores(arr, real_target) >= CERTAIN_SCORE)
        & (arr.sum(axis=1) >= CERTAIN_MIN_SET)
        & correct(arr, real_target)
    )


def attack_summary(
    counts: ArrayLike,
    rho: ArrayLike,
    real_target: ArrayLike,
    syn_target: ArrayLike,
    target_levels: int,
) -> AttackSummary:
    """GCAP, 0CAP and ICAP accuracy, mean GCAP score, zero-rule and random baselines and the
    certain-correct rate of one attack, from `gcap`'s (or `gcap_loo`'s) output.

    0CAP counts records without an exact key match (rho > 0) as wrong; ICAP drops them from the
    denominator. The zero rule always guesses the most frequent target of S (ties to the lowest
    level); the random guess is right with probability 1/target_levels.
    """
    arr = np.asarray(counts, dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != target_levels:
        raise SyntheticCheckError(
            f"counts must have shape (records, {target_levels}), got {arr.shape}"
        )
    distance = np.asarray(rho, dtype=np.int64)
    target = coded_vector(real_target, target_levels, "real_target")
    syn_t = coded_vector(syn_target, target_levels, "syn_target")
    n = arr.shape[0]
    if n == 0 or distance.shape != (n,) or target.shape != (n,):
        raise SyntheticCheckError(
            f"counts, rho and real_target must describe the same >= 1 records, got "
            f"{n}, {distance.shape}, {target.shape}"
        )
    if syn_t.size == 0:
        raise SyntheticCheckError("syn_target is empty: the zero rule needs synthetic records")
    hit = correct(arr, target)
    matched = distance == 0
    mode = int(np.argmax(np.bincount(syn_t, minlength=target_levels)))
    return AttackSummary(
        gcap_accuracy=float(hit.mean()),
        zero_cap_accuracy=float((hit & matched).mean()),
        icap_accuracy=float(hit[matched].mean()) if matched.any() else math.nan,
        non_matches=int((~matched).sum()),
        match_rate=float(matched.mean()),
        gcap_mean_score=float(scores(arr, target).mean()),
        zero_rule_accuracy=float((target == mode).mean()),
        random_guess_accuracy=1.0 / target_levels,
        certain_correct_rate=float(certain_correct(arr, distance, target).mean()),
    )
