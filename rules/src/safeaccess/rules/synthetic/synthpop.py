"""Identity and attribute measures of synthpop's `disclosure()` (no exclusions), and reproduced
full-row uniques.

Definitions (percent of the n_O real records): UiO, unique on the keys in O; repU, unique on the
keys in O and in S; Dorig, every O record with its key shares its target; DiSCO, its key occurs in
S and every S record with that key has the record's target.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

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
