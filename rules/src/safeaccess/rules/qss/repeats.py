"""New rows the auditor has met before, recognised by their sketches.

Researchers repeat query sets: the same table on the same population in a later output, a
regression's groups that an earlier table already released. Such a row equals a kept row, or a
row an earlier admission found dependent on the kept ones (and verified by its sketches). Its
dependency is then known, so the lanes' cross products and Schur complements, which cost a pass
over every kept row's entries, are spent only on the rows not met before.

A row is recognised by its *key*: its sketch values in every lane (`constraints.SKETCHES` random
weights per atom per lane, summed over the row). A split keeps every row's sketch (the pieces'
weights sum to the parent's), so a key stays valid across admissions; a state decoded from bytes
draws fresh sketches and starts with no memory of dropped rows. Kept rows are remembered by their
ids, rows found dependent by their dependencies. Two different rows (vectors over the same
atoms, 0/1 or weighted: the weights enter the sketch) have equal keys with probability Π over lanes of p^-SKETCHES (about 2^-120
with two lanes and two sketches: the weights are uniform, independent and never released), which
is far below the sketch check's own bound for a row every lane drops (p^-SKETCHES per lane).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]

#: A row's sketch values, lane after lane.
Key = tuple[int, ...]


@dataclass(frozen=True)
class SeenRow:
    """A row found dependent on the kept rows, with its dependency in each lane: kept row ids and
    coefficients mod the lane's prime (None for a lane that did not hold every kept row)."""

    terms: tuple[tuple[Int64Array, Int64Array] | None, ...]


def keys_of(sketches: Sequence[Int64Array], rows: Sequence[int] | Int64Array) -> list[Key]:
    """The key of each of `rows`, from each lane's (n_rows, SKETCHES) sketch sums."""
    if len(rows) == 0:
        return []
    joined = np.concatenate([s[np.asarray(rows, dtype=np.int64)] for s in sketches], axis=1)
    return [tuple(int(v) for v in line) for line in joined.tolist()]


def remembered(sketches: Sequence[Int64Array]) -> dict[Key, int | SeenRow]:
    """Every kept row by its key (row id), from each lane's (n_rows, SKETCHES) sketch sums."""
    n_rows = int(sketches[0].shape[0]) if sketches else 0
    return dict(zip(keys_of(sketches, np.arange(n_rows)), range(n_rows), strict=True))
