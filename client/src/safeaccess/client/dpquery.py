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
- dp_sum: `sum(v)` of the present values clipped to [l, u], psi = max(|l|, |u|), then
  `missing`, the records whose value is missing (psi = 1);
- dp_mean: `sum(v - c_v)` for each variable over the records where every variable is present,
  centred at the midpoint c_v of its bounds so that psi = (u - l) / 2, then their `count`
  (psi = 1), then `missing`, the records left out for a missing value (psi = 1);
- dp_histogram: one count per declared bin, then `missing`; one record in at most one of them,
  so the block's L2 sensitivity is 1 however many bins there are;
- dp_mean_test: the two groups of `group`, each with the sums and count of its complete records.

A record moves one *part* of its group's block: a record with a missing value moves only
`missing`, any other record only the statistic's components (a histogram's record one bin). So
the block's sensitivity is the largest part's, and the `missing` count costs no budget when its
weight makes its part no larger than the statistic's (`default_weights`).
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


#: The component counting the records of a group left out for a missing value.
MISSING = "missing"


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
    # The alternative sets of components one record can move (indexes into `components`);
    # None: one part, all of them.
    parts: list[list[int]] | None = None

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
        parts = self.parts if self.parts is not None else [list(range(k))]
        worst = 0.0
        for g in range(len(self.groups)):
            for part in parts:
                worst = max(worst, math.fsum(w[g * k + c] * self.psi[c] ** 2 for c in part))
        return records_per_unit * math.sqrt(worst)

    def index(self, component: str) -> int | None:
        return self.components.index(component) if component in self.components else None


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
    parts: list[list[int]] | None = None
    if isinstance(analysis, DPCount):
        components, psi, centres = ["count"], [1.0], [0.0]
    elif isinstance(analysis, DPSum):
        lo, hi = _bounds(metadata, analysis.variable)
        components = [f"sum({analysis.variable})", MISSING]
        psi, centres = [max(abs(lo), abs(hi)), 1.0], [0.0, 0.0]
        parts = [[0], [1]]
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
        if isinstance(analysis, DPMean):
            parts = [list(range(len(components))), [len(components)]]
            components.append(MISSING)
            psi.append(1.0)
            centres.append(0.0)
    elif isinstance(analysis, DPHistogram):
        _bounds(metadata, analysis.variable)
        e = analysis.edges
        components = [
            f"[{e[i]:g}, {e[i + 1]:g}{']' if i == len(e) - 2 else ')'}" for i in range(len(e) - 1)
        ]
        components.append(MISSING)
        psi, centres = [1.0] * len(components), [0.0] * len(components)
        parts = [[i] for i in range(len(components))]
    else:  # pragma: no cover - every DP kind is handled above
        raise LayoutError(f"{analysis.kind} is not a differentially private kind")
    out = Layout(
        by=by,
        groups=groups,
        components=components,
        psi=psi,
        centres=centres,
        parts=parts,
    )
    if out.size > MAX_COMPONENTS:
        raise LayoutError(
            f"the answer would have {out.size} components (limit {MAX_COMPONENTS}); group by "
            "fewer or coarser columns"
        )
    return out


def region_weights(shape: Layout) -> list[float]:
    """Shoham & Rinott's region-optimal weights (Theorem 1) for a block whose record moves one
    part: the ellipsoid's volume is minimal, at the plain query's L2 sensitivity C, when in each
    part P every component has an equal share, xi_i psi_i^2 = C / |P| (the theorem applied to
    each part, whose constraints are separate)."""
    k = len(shape.components)
    parts = shape.parts if shape.parts is not None else [list(range(k))]
    psi2 = [p * p for p in shape.psi]
    total = max(math.fsum(psi2[c] for c in part) for part in parts)
    xi = [0.0] * k
    for part in parts:
        for c in part:
            xi[c] = total / len(part) / psi2[c]
    return [w for _ in shape.groups for w in xi]


def default_weights(analysis: Analysis, shape: Layout) -> list[float] | None:
    """The per-component weights xi of a request calibrated by (epsilon, delta) without a
    transformation of its own: each component's noise is sigma / sqrt(xi), chosen for the answer
    the kind is for, at the L2 sensitivity of the plain query (so the same budget).

    - dp_mean, for the means: the mean of variable v is c_v + S_v / n with variance about
      (sigma_S^2 + d^2 sigma_n^2) / n^2, d = mean - c_v, |d| <= h_v. Minimising the worst case
      (d = h_v) summed over the p variables in units of h_v, under the sensitivity constraint
      sum_v xi_v h_v^2 + xi_n = C, gives equal shares a = xi_v h_v^2 for the sums and
      sqrt(p) * a for the count: a = C / (p + sqrt(p)). With one variable the sum's noise is
      h times the count's (half of mu^2 each), not the count buried under the sum's sigma.
    - `missing` (dp_sum, dp_mean, dp_histogram) gets the weight that makes its part as large as
      the statistic's: a record moves one part only, so it is answered at no extra budget.
    None when nothing is to be shaped (dp_count).
    """
    k = len(shape.components)
    if k == 1:
        return None
    psi2 = [p * p for p in shape.psi]
    present = list(range(k - 1)) if shape.components[-1] == MISSING else list(range(k))
    xi = [1.0] * k
    if isinstance(analysis, DPMean):
        n_vars = len(analysis.variables)
        total = math.fsum(psi2[c] for c in present)
        share = total / (n_vars + math.sqrt(n_vars))
        for v in range(n_vars):
            xi[v] = share / psi2[v]
        xi[n_vars] = math.sqrt(n_vars) * share
    if shape.components[-1] == MISSING:
        parts = shape.parts if shape.parts is not None else [present]
        xi[-1] = max(math.fsum(xi[c] * psi2[c] for c in p) for p in parts if k - 1 not in p)
        xi[-1] /= psi2[-1]
    if all(w == 1.0 for w in xi):
        return None
    block = [xi[c] for c in range(k)]
    return [w for _ in shape.groups for w in block]


__all__ = [
    "DP_QUERY_TYPES",
    "MAX_COMPONENTS",
    "MISSING",
    "DPQuery",
    "Layout",
    "LayoutError",
    "declared_levels",
    "default_weights",
    "group_levels",
    "layout",
    "region_weights",
]
