"""MST-G tree selection: score every column pair, then Kruskal's maximum spanning tree.

The score of a pair is the L1 distance between its exact table and the independence table built
from released quantities only (the noisy one-way marginals and the noisy total). One record
moves one cell of the exact table by 1, so each score moves by at most 1 per record: the score
vector is released with Gaussian noise (sensitivity m * sqrt(P)) and the tree picked from the
noisy scores is post-processing. No exponential mechanism is involved.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from safeaccess.rules.synthetic.errors import SyntheticCheckError


def pair_scores(
    pair_tables: Sequence[ArrayLike],
    pairs: Sequence[tuple[int, int]],
    noisy_oneways: Sequence[ArrayLike],
    total: float,
) -> NDArray[np.float64]:
    """||T_ab - total * p_a (x) p_b||_1 for each pair (a, b), where p_a is the noisy one-way
    marginal of column a clipped at 0 and normalised. `pair_tables[i]` is the exact table of
    `pairs[i]` (shape L_a x L_b, or flat in C order)."""
    if len(pair_tables) != len(pairs):
        raise SyntheticCheckError(f"{len(pair_tables)} pair tables for {len(pairs)} pairs")
    probs = []
    for i, m in enumerate(noisy_oneways):
        v = np.clip(np.asarray(m, dtype=np.float64).ravel(), 0.0, None)
        if v.size == 0:
            raise SyntheticCheckError(f"one-way marginal {i} is empty")
        # all cells noised below 0: nothing is known about the column, so uniform
        probs.append(v / v.sum() if v.sum() > 0 else np.full(v.size, 1.0 / v.size))
    out = np.empty(len(pairs))
    for i, ((a, b), table) in enumerate(zip(pairs, pair_tables, strict=True)):
        if not (0 <= a < len(probs) and 0 <= b < len(probs)) or a == b:
            raise SyntheticCheckError(
                f"pair {(a, b)} does not name two columns 0..{len(probs) - 1}"
            )
        t = np.asarray(table, dtype=np.float64).ravel()
        expected = total * np.outer(probs[a], probs[b]).ravel()
        if t.size != expected.size:
            raise SyntheticCheckError(
                f"pair {(a, b)}: table has {t.size} cells, the one-ways give {expected.size}"
            )
        out[i] = np.abs(t - expected).sum()
    return out


def max_spanning_tree(
    n_columns: int, pairs: Sequence[tuple[int, int]], scores: ArrayLike
) -> list[tuple[int, int]]:
    """Kruskal's maximum spanning tree (a forest if the pairs do not connect every column);
    equal scores keep the order of `pairs`. Returns the chosen pairs in the order chosen."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    if s.size != len(pairs):
        raise SyntheticCheckError(f"{s.size} scores for {len(pairs)} pairs")
    parent = list(range(n_columns))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    tree: list[tuple[int, int]] = []
    for i in np.argsort(-s, kind="stable"):
        a, b = pairs[int(i)]
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[ra] = rb
            tree.append((a, b))
    return tree
