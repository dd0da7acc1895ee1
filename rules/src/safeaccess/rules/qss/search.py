"""Finding small determined sets of atoms from random null vectors.

For a null vector v of the released constraints, a set S of atoms is determined (its aggregate
follows from the released ones) exactly when Σ_S v = 0 for every null vector. With two
independent uniformly random null vectors per lane, a set that is *not* determined passes both
tests with probability 1/p² (p ≈ 2**30): a chance zero can only make the auditor refuse, never
release. Singles are a scan; pairs are a hash join of v against −v. These are the auditor's fast
refusals; every other combination is decided by the rank certificate (certificate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]

_BUCKET_BITS = 23


@dataclass(frozen=True)
class LaneVectors:
    """Two independent random null vectors of one lane, mod its prime."""

    p: int
    first: Int64Array
    second: Int64Array

    def keys(self, atoms: Int64Array) -> Int64Array:
        return self.first[atoms] * self.p + self.second[atoms]

    def negated_sum_keys(self, a: Int64Array, b: Int64Array) -> Int64Array:
        p = self.p
        t1 = (2 * p - self.first[a] - self.first[b]) % p
        t2 = (2 * p - self.second[a] - self.second[b]) % p
        return t1 * p + t2


@dataclass(frozen=True)
class Isolated:
    """A determined set of atoms below the threshold."""

    atoms: tuple[int, ...]
    size: int

    @property
    def kind(self) -> str:
        return "atom" if len(self.atoms) == 1 else f"union of {len(self.atoms)} atoms"


def determined_atoms(lanes: list[LaneVectors], n_atoms: int) -> npt.NDArray[np.bool_]:
    """Atoms whose aggregate is determined (both vectors vanish) in any lane."""
    found = np.zeros(n_atoms, dtype=bool)
    for lane in lanes:
        found |= (lane.first == 0) & (lane.second == 0)
    return found


def smallest_pair(
    lanes: list[LaneVectors], candidates: Int64Array, sizes: Int64Array, k: int
) -> Isolated | None:
    """The smallest determined union of two candidate atoms with fewer than k records."""
    best: Isolated | None = None
    if candidates.size < 2:
        return None
    for lane in lanes:
        keys = lane.keys(candidates)
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        p = lane.p
        targets = ((p - lane.first[candidates]) % p) * p + (p - lane.second[candidates]) % p
        lo = np.searchsorted(sorted_keys, targets, side="left")
        hi = np.searchsorted(sorted_keys, targets, side="right")
        for i in np.flatnonzero(hi > lo):
            for pos in range(int(lo[i]), int(hi[i])):
                j = int(order[pos])
                if j == i:
                    continue
                a, b = int(candidates[i]), int(candidates[j])
                size = int(sizes[a] + sizes[b])
                if size < k and (best is None or size < best.size):
                    best = Isolated(atoms=tuple(sorted((a, b))), size=size)
    return best
