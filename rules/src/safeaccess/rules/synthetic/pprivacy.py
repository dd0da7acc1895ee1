"""Chen's p-privacy (Alg. 4, Eq. 9) and the dependency cliques it is computed over.

The candidate table F is the product of S's distinct projections on each clique; p = (xi/|F|) *
(xi/|O|) with xi the number of distinct real rows that are in F. A real row is in F exactly when
each of its clique projections occurs among S's, so F is never built: one hash join per clique.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike
from scipy.sparse.csgraph import connected_components

from safeaccess.rules.synthetic.coding import row_ids
from safeaccess.rules.synthetic.errors import SyntheticCheckError


def dependency_cliques(
    syn: ArrayLike, tau: float = 0.9, *, categorical: Sequence[bool] | None = None
) -> list[tuple[int, ...]]:
    """Connected components of the graph linking columns whose association on S is >= tau.

    Association is |Pearson r| between two numeric/ordinal columns and Cramer's V when either is
    categorical (`categorical[i]`; default: every column numeric). A constant column has no
    association. Components are returned sorted, each as sorted column indices."""
    s = np.asarray(syn, dtype=np.float64)
    if s.ndim != 2:
        raise SyntheticCheckError("syn must be a 2-D array (records x columns)")
    if not 0.0 <= tau <= 1.0:
        raise SyntheticCheckError(f"tau must lie in [0, 1], got {tau!r}")
    d = s.shape[1]
    cat = [False] * d if categorical is None else [bool(c) for c in categorical]
    if len(cat) != d:
        raise SyntheticCheckError(f"categorical has {len(cat)} entries for {d} columns")
    adj = np.zeros((d, d), dtype=bool)
    for a in range(d):
        for b in range(a + 1, d):
            if cat[a] or cat[b]:
                assoc = cramers_v(s[:, a], s[:, b])
            else:
                assoc = abs_pearson(s[:, a], s[:, b])
            adj[a, b] = adj[b, a] = assoc >= tau
    n_comp, labels = connected_components(adj, directed=False)
    groups = [tuple(int(i) for i in np.flatnonzero(labels == c)) for c in range(n_comp)]
    return sorted(groups)


def abs_pearson(x: ArrayLike, y: ArrayLike) -> float:
    """|Pearson correlation|, 0 when either column is constant."""
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    a = xa - xa.mean()
    b = ya - ya.mean()
    denom = math.sqrt(float(a @ a) * float(b @ b))
    return abs(float(a @ b)) / denom if denom > 0 else 0.0


def cramers_v(x: ArrayLike, y: ArrayLike) -> float:
    """Cramer's V of two categorical columns (0 when either has a single value)."""
    xa, ya = np.asarray(x), np.asarray(y)
    _, xi = np.unique(xa, return_inverse=True)
    _, yi = np.unique(ya, return_inverse=True)
    r, c = int(xi.max()) + 1, int(yi.max()) + 1
    if xa.size == 0 or min(r, c) < 2:
        return 0.0
    table = np.bincount(xi.reshape(-1) * c + yi.reshape(-1), minlength=r * c).reshape(r, c)
    expected = np.outer(table.sum(1), table.sum(0)) / xa.size
    chi2 = float(((table - expected) ** 2 / expected).sum())
    return math.sqrt(chi2 / (xa.size * (min(r, c) - 1)))


def p_privacy(
    real: ArrayLike, syn: ArrayLike, cliques: Sequence[Sequence[int]]
) -> tuple[int, int, float]:
    """(|F|, xi, p) of Chen's Eq. 9 for disjoint `cliques` of column indices; columns in no
    clique are cliques of their own. |O| is the number of real records."""
    o = np.asarray(real)
    s = np.asarray(syn)
    if o.ndim != 2 or s.ndim != 2 or o.shape[1] != s.shape[1]:
        raise SyntheticCheckError(
            f"real and syn must be 2-D with the same columns, got {o.shape} and {s.shape}"
        )
    if o.shape[0] == 0 or s.shape[0] == 0:
        raise SyntheticCheckError("p-privacy needs records in both real and syn")
    d = o.shape[1]
    seen: set[int] = set()
    groups: list[list[int]] = []
    for clique in cliques:
        cols = [int(c) for c in clique]
        if not cols or any(not 0 <= c < d for c in cols) or seen.intersection(cols):
            raise SyntheticCheckError(
                f"cliques must be non-empty, disjoint lists of column indices 0..{d - 1}; "
                f"got {list(clique)}"
            )
        seen.update(cols)
        groups.append(cols)
    groups += [[c] for c in range(d) if c not in seen]
    distinct = np.unique(o, axis=0)
    in_f = np.ones(distinct.shape[0], dtype=bool)
    f_size = 1
    for cols in groups:
        r_ids, s_ids = row_ids(_codes(distinct[:, cols]), _codes(s[:, cols]))
        f_size *= int(np.unique(s_ids).size)
        in_f &= np.isin(r_ids, s_ids)
    xi = int(in_f.sum())
    p = (xi / f_size) * (xi / o.shape[0])
    return f_size, xi, p


def _codes(arr: np.ndarray) -> np.ndarray:
    # exact equality of values: integers as they are, floats by their bit patterns
    if np.issubdtype(arr.dtype, np.integer):
        return arr.astype(np.int64)
    return (np.asarray(arr, dtype=np.float64) + 0.0).view(np.int64)
