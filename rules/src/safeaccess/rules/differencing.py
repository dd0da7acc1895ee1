"""Differencing between a new output and the outputs released earlier (Denning's tracker lesson).

Every aggregate the sandbox computes carries its query set: the records behind it. Two released
aggregates whose query sets differ by a few records reveal an aggregate over just those records:
the mean income of everyone and the mean income of everyone but one person give that person's
income, although each passes every per-output check. So for each cell of a new output and each
cell released earlier to the same researcher on the same dataset that shares records with it,
the records in one but not the other (both ways round, together) must be none or at least the
threshold.

This is the pairwise part of query-set-size control; it does not audit combinations of three or
more releases (the atom partition of the architecture). The engine runs it on every output with
the release history the caller passes (the server passes what it already gave the researcher on
the same dataset).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import Output, QuerySet, TableOutput

CHECK = "differencing"


def _query_set(output: Output | BaseModel) -> QuerySet | None:
    facts = getattr(output, "facts", None)
    found = getattr(facts, "query_set", None)
    return found if isinstance(found, QuerySet) else None


def _released_cells(output: Output | BaseModel, n_cells: int) -> np.ndarray:
    """Which query-set cells were released: all, except the body cells a mitigation suppressed
    (their value never leaves, so their records take part in no difference)."""
    released = np.ones(n_cells, dtype=bool)
    if not isinstance(output, TableOutput) or output.suppressed is None:
        return released
    two_way = bool(output.col_vars)
    width = len(output.col_labels) - (1 if output.margins and two_way else 0)
    if width <= 0:
        return released
    for i in range(n_cells):
        r, c = divmod(i, width)
        if r < len(output.suppressed) and c < len(output.suppressed[r]):
            released[i] = not output.suppressed[r][c]
    return released


def _cells(output: Output | BaseModel) -> tuple[QuerySet, np.ndarray] | None:
    """The output's query set with its unreleased cells marked -1, or None without one."""
    qs = _query_set(output)
    if qs is None:
        return None
    index = qs.to_array().astype(np.int64)
    keep = _released_cells(output, len(qs.labels))
    inside = index >= 0
    index[inside & ~keep[np.clip(index, 0, len(keep) - 1)]] = -1
    return qs, index


def differencing_findings(
    output: Output, history: Sequence[Output], threshold: int
) -> list[Finding]:
    """Withhold findings for cells of `output` that differ from an overlapping earlier cell by
    1..threshold-1 records (counting both ways round)."""
    found = _cells(output)
    if found is None or threshold <= 1 or not found[0].labels:
        return []
    current, new = found
    n_new = len(current.labels)
    new_sizes = np.bincount(new[new >= 0], minlength=n_new)
    flagged: dict[int, str] = {}
    for earlier in history:
        before = _cells(earlier)
        if before is None or not before[0].labels:
            continue
        previous, old = before
        if len(old) != len(new):
            continue  # another dataset version: record ids do not line up
        n_old = len(previous.labels)
        old_sizes = np.bincount(old[old >= 0], minlength=n_old)
        both = (new >= 0) & (old >= 0)
        shared = np.bincount(new[both] * n_old + old[both], minlength=n_new * n_old).reshape(
            n_new, n_old
        )
        only_new = new_sizes[:, None] - shared
        only_old = old_sizes[None, :] - shared
        # The difference of the two aggregates is an aggregate over the records in one cell but
        # not the other (minus one over the converse): a threat when those are few in all.
        # Overlapping cells with a large part on either side reveal no small group this way.
        apart = only_new + only_old
        small = (shared > 0) & (apart > 0) & (apart < threshold)
        for i, j in zip(*np.nonzero(small), strict=True):
            flagged.setdefault(int(i), previous.labels[int(j)])
    return [
        Finding(
            check=CHECK,
            verdict="withhold",
            item=current.labels[i],
            message=(
                f"{current.labels[i]} and the earlier released {other!r} differ by fewer than "
                f"{threshold} records, so together they reveal an aggregate of those few records."
            ),
        )
        for i, other in sorted(flagged.items())
    ]
