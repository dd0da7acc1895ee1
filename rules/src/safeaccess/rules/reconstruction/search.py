"""Other samples near a known one that fit the same released statistics.

For large groups an exact analysis may not fit the time budget, but the check knows the true
sample (from the facts), which always fits. Small changes to it -- moving one or two records to
another value, or the moves (+1, -3, +3, -1) and (+1, -2, 0, +2, -1) on consecutive values,
which keep the count, sum and sum of squares exactly -- usually give other consistent samples
at once, and each one found proves that some counts are not pinned down.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import combinations, islice

from safeaccess.rules.reconstruction.matching import SampleConstraints

Move = tuple[tuple[int, int], ...]

_KERNEL_PATTERNS = ((1, -3, 3, -1), (1, -2, 0, 2, -1))
# Moves tried at most: single and kernel moves come first, then pairs of transfers; on a
# 21-point scale all pairs would be ~88 000 candidates, so stop well before that.
MAX_MOVES = 20_000


def _moves(k: int) -> Iterator[Move]:
    transfers: list[Move] = [((u, -1), (w, 1)) for u in range(k) for w in range(k) if u != w]
    yield from transfers
    for pattern in _KERNEL_PATTERNS:
        for sign in (1, -1):
            for start in range(k - len(pattern) + 1):
                yield tuple((start + i, sign * d) for i, d in enumerate(pattern) if d)
    for a, b in combinations(transfers, 2):
        yield a + b


def local_alternatives(cons: SampleConstraints, truth: Sequence[int]) -> Iterator[list[int]]:
    """Consistent samples (counts by value, lowest first) a few record moves from `truth`."""
    k = len(truth)
    seen = {tuple(truth)}
    for move in islice(_moves(k), MAX_MOVES):
        candidate = list(truth)
        for index, delta in move:
            candidate[index] += delta
        if min(candidate) < 0:
            continue
        key = tuple(candidate)
        if key in seen:
            continue
        seen.add(key)
        if cons.admits_vector(candidate):
            yield candidate
