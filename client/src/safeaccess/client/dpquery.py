"""The shape and sensitivity of a differentially private query, from the analysis and the
published metadata alone (never from data).

One function, `layout(analysis, metadata)`, gives what the client, the sandbox runner and the
server must agree on: the groups (every declared level combination of the `by` columns, in
declared order, empty ones included), the components each group's answer has, and how far one
record can move each component (its sensitivity psi). The server derives the L2 sensitivity of
the released vector from this and the declared neighbouring relation, so nothing the sandbox
measures can change how much noise is added.

Sensitivities under "add or remove one record" (one record lies in at most one group):
- dp_count: one component `count`, psi = 1;
- dp_sum: `sum(v)` of values clipped to [l, u], psi = max(|l|, |u|);
- dp_mean: `sum(v - c_v)` for each variable, centred at the midpoint c_v of its bounds so that
  psi = (u - l) / 2, then `count` with psi = 1 (missing values count at the midpoint);
- dp_histogram: one count per declared bin, one record in at most one bin, so the block's L2
  sensitivity is 1 however many bins there are;
- dp_mean_test: the two groups of `group`, each with the dp_mean components.
Under "add or remove one contributor unit" with at most m records each, every bound is m times
larger (triangle inequality).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from safeaccess.client.analyses import (
    Analysis,
    DPCount,
    DPHistogram,
    DPMean,
    DPMeanTest,
    DPSum,
)
from safeaccess.client.metadata import Column, DatasetMetadata

Label = str | int | float | bool | None

#: Most released components one DP answer may have (groups x components).
MAX_COMPONENTS = 10_000

DPQuery = DPCount | DPSum | DPMean | DPHistogram | DPMeanTest
DP_QUERY_TYPES = (DPCount, DPSum, DPMean, DPHistogram, DPMeanTest)


class LayoutError(ValueError):
    """The query cannot be laid out from the metadata (a column lacks bounds or levels)."""


def declared_levels(col: Column) -> list[Label] | None:
    """The levels a grouping column declares: its `levels`, else the points of its `scale`."""
    if col.levels:
        return list(col.levels)
    if col.scale is not None:
        return list(range(col.scale[0], col.scale[1] + 1))
    return None


@dataclass(frozen=True)
class Layout:
    """Groups x components of a DP answer and each component's per-record sensitivity."""

    by: list[str]
    groups: list[list[Label]]
    components: list[str]
    psi: list[float]
    centres: list[float]
    exclusive: bool = False  # a record moves at most one component of its group (bins)

    @property
    def size(self) -> int:
        return len(self.groups) * len(self.components)

    def psi_vector(self) -> list[float]:
        """Per-component sensitivities of the flattened answer (group-major)."""
        return [p for _ in self.groups for p in self.psi]

    def l2_sensitivity(
        self, weights: Sequence[float] | None = None, records_per_unit: int = 1
    ) -> float:
        """The L2 sensitivity of `Diag(weights)^(1/2) f` (weights default to 1): one unit changes
        one group's block (or, with m records, at most m blocks by m times as much in total)."""
        k = len(self.components)
        w = list(weights) if weights is not None else [1.0] * self.size
        if len(w) != self.size:
            raise LayoutError(f"{len(w)} weights for an answer of {self.size} components")
        worst = 0.0
        for g in range(len(self.groups)):
            moved = [w[g * k + c] * self.psi[c] ** 2 for c in range(k)]
            worst = max(worst, max(moved) if self.exclusive else sum(moved))
        return records_per_unit * math.sqrt(worst)


def _bounds(metadata: DatasetMetadata, name: str) -> tuple[float, float]:
    col = metadata.column(name)
    if col is None or col.bounds is None:
        raise LayoutError(f"column {name!r} has no declared bounds")
    return float(col.bounds[0]), float(col.bounds[1])


def group_levels(metadata: DatasetMetadata, by: Sequence[str]) -> list[list[Label]]:
    """Every combination of the declared levels of `by`, row-major in declared order."""
    groups: list[list[Label]] = [[]]
    for name in by:
        col = metadata.column(name)
        levels = declared_levels(col) if col is not None else None
        if not levels:
            raise LayoutError(f"column {name!r} declares no levels to group by")
        groups = [[*prefix, level] for prefix in groups for level in levels]
    return groups


def layout(analysis: Analysis, metadata: DatasetMetadata) -> Layout:
    """The layout of a DP analysis; LayoutError if the metadata does not pin it down."""
    if isinstance(analysis, DPMeanTest):
        col = metadata.column(analysis.group)
        levels = declared_levels(col) if col is not None else None
        if levels is None or len(levels) != 2:
            raise LayoutError(f"column {analysis.group!r} must declare exactly two levels")
        by = [analysis.group]
        groups: list[list[Label]] = [[lvl] for lvl in levels]
    elif isinstance(analysis, DPCount | DPSum | DPMean | DPHistogram):
        by = list(analysis.by)
        groups = group_levels(metadata, by)
    else:
        raise LayoutError(f"{analysis.kind} is not a differentially private kind")
    components: list[str]
    psi: list[float]
    centres: list[float]
    if isinstance(analysis, DPCount):
        components, psi, centres = ["count"], [1.0], [0.0]
    elif isinstance(analysis, DPSum):
        lo, hi = _bounds(metadata, analysis.variable)
        components = [f"sum({analysis.variable})"]
        psi, centres = [max(abs(lo), abs(hi))], [0.0]
    elif isinstance(analysis, DPMean | DPMeanTest):
        components, psi, centres = [], [], []
        for name in analysis.variables:
            lo, hi = _bounds(metadata, name)
            components.append(f"sum({name} - {(lo + hi) / 2:g})")
            psi.append((hi - lo) / 2)
            centres.append((lo + hi) / 2)
        components.append("count")
        psi.append(1.0)
        centres.append(0.0)
    elif isinstance(analysis, DPHistogram):
        _bounds(metadata, analysis.variable)
        e = analysis.edges
        components = [
            f"[{e[i]:g}, {e[i + 1]:g}{']' if i == len(e) - 2 else ')'}" for i in range(len(e) - 1)
        ]
        psi, centres = [1.0] * len(components), [0.0] * len(components)
    else:  # pragma: no cover - every DP kind is handled above
        raise LayoutError(f"{analysis.kind} is not a differentially private kind")
    out = Layout(
        by=by,
        groups=groups,
        components=components,
        psi=psi,
        centres=centres,
        exclusive=isinstance(analysis, DPHistogram),
    )
    if out.size > MAX_COMPONENTS:
        raise LayoutError(
            f"the answer would have {out.size} components (limit {MAX_COMPONENTS}); group by "
            "fewer or coarser columns"
        )
    return out


__all__ = [
    "DP_QUERY_TYPES",
    "MAX_COMPONENTS",
    "DPQuery",
    "Layout",
    "LayoutError",
    "declared_levels",
    "group_levels",
    "layout",
]
