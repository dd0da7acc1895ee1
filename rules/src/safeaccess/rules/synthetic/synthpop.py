"""Identity and attribute measures of synthpop's `disclosure()` (no exclusions), and reproduced
full-row uniques.

Definitions (percent of the n_O real records): UiO, unique on the keys in O; repU, unique on the
keys in O and in S; Dorig, every O record with its key shares its target; DiSCO, its key occurs in
S and every S record with that key has the record's target.

A release that models the population well reproduces rare real rows by chance: a row of
probability p turns up among m draws with probability 1 - (1 - p)^m, whether or not its owner was
in O. `uniques_excess` measures what S reproduces beyond that, against a split-half reference: O
is split at random into halves A and B; for each row unique within A, whether it occurs in B (an
independent sample of the population, without that record) and whether it occurs in as many rows
of S. Both halves take each role once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from safeaccess.rules.synthetic.attack import DEFAULT_RESAMPLES, Interval, paired_bootstrap
from safeaccess.rules.synthetic.coding import IntArray, row_ids
from safeaccess.rules.synthetic.errors import SyntheticCheckError


@dataclass(frozen=True)
class SynthpopMeasures:
    """Percentages of the real records (0..100); readable as attributes or as a mapping."""

    UiO: float
    repU: float
    DiSCO: float
    Dorig: float

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReproducedUniques:
    """Real records unique on all columns and how many of them occur verbatim in S."""

    real_uniques: int
    reproduced: int

    @property
    def share(self) -> float:
        """reproduced / real_uniques (0 when O has no full-row unique)."""
        return self.reproduced / self.real_uniques if self.real_uniques else 0.0


def synthpop_measures(
    real_keys: ArrayLike, real_target: ArrayLike, syn_keys: ArrayLike, syn_target: ArrayLike
) -> SynthpopMeasures:
    """UiO, repU, DiSCO and Dorig in percent, for coded keys (records x k) and targets."""
    rk, rt = _keys_target(real_keys, real_target, "real")
    sk, st = _keys_target(syn_keys, syn_target, "syn")
    if rk.shape[1] != sk.shape[1]:
        raise SyntheticCheckError(
            f"real_keys has {rk.shape[1]} columns but syn_keys has {sk.shape[1]}"
        )
    if rk.shape[0] == 0:
        raise SyntheticCheckError("the real data has no records")
    r_ids, s_ids = row_ids(rk, sk)
    n_keys = int(max(r_ids.max(initial=-1), s_ids.max(initial=-1))) + 1
    in_o = np.bincount(r_ids, minlength=n_keys)
    in_s = np.bincount(s_ids, minlength=n_keys)
    # (key, target) cells: ids over the stacked pairs, so a cell means the same in O and S
    r_cell, s_cell = row_ids(np.c_[r_ids, rt], np.c_[s_ids, st])
    n_cells = int(max(r_cell.max(initial=-1), s_cell.max(initial=-1))) + 1
    cell_o = np.bincount(r_cell, minlength=n_cells)
    cell_s = np.bincount(s_cell, minlength=n_cells)
    unique_o = in_o[r_ids] == 1
    key_in_s = in_s[r_ids] > 0
    n = rk.shape[0]
    return SynthpopMeasures(
        UiO=100.0 * unique_o.sum() / n,
        repU=100.0 * (unique_o & (in_s[r_ids] == 1)).sum() / n,
        DiSCO=100.0 * (key_in_s & (cell_s[r_cell] == in_s[r_ids])).sum() / n,
        Dorig=100.0 * (cell_o[r_cell] == in_o[r_ids]).sum() / n,
    )


def reproduced_uniques(real: ArrayLike, syn: ArrayLike) -> ReproducedUniques:
    """How many real records unique on all their columns occur as a row of S."""
    r = _matrix(real, "real")
    s = _matrix(syn, "syn")
    if r.shape[1] != s.shape[1]:
        raise SyntheticCheckError(f"real has {r.shape[1]} columns but syn has {s.shape[1]}")
    r_ids, s_ids = row_ids(r, s)
    size = int(max(r_ids.max(initial=-1), s_ids.max(initial=-1))) + 1
    unique = np.bincount(r_ids, minlength=size)[r_ids] == 1
    present = np.bincount(s_ids, minlength=size)[r_ids] > 0
    return ReproducedUniques(int(unique.sum()), int((unique & present).sum()))


@dataclass(frozen=True)
class UniquesExcess:
    """Rows unique within a half of O: the share S reproduces (in as many rows as the other
    half has) minus the share the other half reproduces, with its paired bootstrap interval."""

    uniques: int
    syn_share: float
    ref_share: float
    excess: Interval


def uniques_excess(
    real: ArrayLike, syn: ArrayLike, *, seed: int = 0, resamples: int = DEFAULT_RESAMPLES
) -> UniquesExcess:
    """Split-half reference for reproduced full-row uniques (module docstring).

    For each half A of a random split of O (and then the other half): the rows unique within A,
    whether each occurs among m rows of the other half B and among m rows of S, m = min(|B|,
    |S|) (all of B or S when it has m rows, else a random subset drawn with `seed`). The
    outcomes of both halves are pooled and compared record by record."""
    r = _matrix(real, "real")
    s = _matrix(syn, "syn")
    if r.shape[1] != s.shape[1]:
        raise SyntheticCheckError(f"real has {r.shape[1]} columns but syn has {s.shape[1]}")
    if r.shape[0] < 4 or s.shape[0] < 1:
        raise SyntheticCheckError("the split-half reference needs >= 4 real and >= 1 syn records")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(r.shape[0])
    halves = (perm[: r.shape[0] // 2], perm[r.shape[0] // 2 :])
    hit_syn: list[np.ndarray] = []
    hit_ref: list[np.ndarray] = []
    for a, b in (halves, halves[::-1]):
        m = min(b.size, s.shape[0])
        b_rows = r[b if b.size == m else rng.choice(b, size=m, replace=False)]
        s_rows = s if s.shape[0] == m else s[rng.choice(s.shape[0], size=m, replace=False)]
        a_ids, b_ids, s_ids = row_ids(r[a], b_rows, s_rows)
        unique = np.bincount(a_ids, minlength=int(a_ids.max()) + 1)[a_ids] == 1
        hit_ref.append(np.isin(a_ids[unique], b_ids))
        hit_syn.append(np.isin(a_ids[unique], s_ids))
    x, y = np.concatenate(hit_syn), np.concatenate(hit_ref)
    if x.size == 0:  # every row of O is repeated within its half: nothing unique to copy
        return UniquesExcess(0, 0.0, 0.0, Interval(0.0, 0.0, 0.0))
    return UniquesExcess(
        int(x.size),
        float(x.mean()),
        float(y.mean()),
        paired_bootstrap(x, y, resamples=resamples, seed=seed),
    )


def _keys_target(keys: ArrayLike, target: ArrayLike, side: str) -> tuple[IntArray, IntArray]:
    k = _matrix(keys, f"{side}_keys")
    t = np.asarray(target)
    if t.ndim != 1 or t.shape[0] != k.shape[0]:
        raise SyntheticCheckError(
            f"{side}_target must be a vector with one entry per record of {side}_keys "
            f"({k.shape[0]}), got shape {t.shape}"
        )
    return k, _as_int(t, f"{side}_target")


def _matrix(values: ArrayLike, name: str) -> IntArray:
    arr = np.asarray(values)
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2:
        raise SyntheticCheckError(f"{name} must be a 2-D array (records x columns)")
    return _as_int(arr, name)


def _as_int(arr: np.ndarray, name: str) -> IntArray:
    if (
        arr.size
        and not np.issubdtype(arr.dtype, np.integer)
        and not (np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)))
    ):
        raise SyntheticCheckError(f"{name} must hold integer codes")
    return arr.astype(np.int64, copy=False)
