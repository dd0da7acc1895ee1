"""Histograms (DwB class 8, graphs): per-bin threshold, empty bins, bin edges that reveal extremes.

Sources: DwB/SDAP guidelines (apply the rule of the underlying statistic to a graph: a histogram
is a frequency table of its bins); ACRO's per-bin `MinimumThresholdCheck` and its notes on
extreme bins and bin edges (ACRO issues #192 and #308, edge and extreme-value checks of #382).

Bins lie along the columns (one row per `by` group), as the sandbox runner lays them out; a
histogram whose rows match the bin edges instead is read the other way round. Empty bins at either end of the range are not
treated as disclosive zeros (ACRO #308: otherwise every histogram with a tail fails); empty bins in
between are, when the rule set says zeros are disclosive. Bin edges computed from the data (a bin
count spread between the observed minimum and maximum) publish the raw extremes: withhold.
"""

from __future__ import annotations

import numpy as np

from safeaccess.rules.checks.cells import Located, locate, matrix, released_mask
from safeaccess.rules.checks.frequency import threshold
from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import TableOutput
from safeaccess.rules.ruleset import RuleSet


def _bin_axis(output: TableOutput, counts: np.ndarray) -> int:
    """1 when bins are the columns (the runner's layout), 0 when they are the rows."""
    if output.bin_edges is not None and counts.shape[0] == len(output.bin_edges) - 1:
        return 0 if counts.shape[1] != len(output.bin_edges) - 1 else 1
    return 1


def _interior_empty(counts: np.ndarray, axis: int) -> np.ndarray:
    """Empty bins with a non-empty bin on both sides of them in the same group."""
    nonzero = counts > 0
    below = np.maximum.accumulate(nonzero, axis=axis)
    above = np.flip(np.maximum.accumulate(np.flip(nonzero, axis=axis), axis=axis), axis=axis)
    return (~nonzero) & below & above


def bin_edges(output: TableOutput, rs: RuleSet) -> list[Located]:
    """Withhold when the outer edges are the data's extremes; review when that is unknown."""
    from_data = output.facts.bin_edges_from_data
    if from_data is False:
        return []
    if from_data:
        edges = output.bin_edges or []
        shown = f" ({edges[0]:g} and {edges[-1]:g})" if len(edges) >= 2 else ""
        finding = Finding(
            check="bin_edges",
            verdict=rs.extremes,
            item="bin edges",
            message=f"the outer bin edges{shown} were computed from the data, so they are the "
            "observed minimum and maximum. Give the bin edges yourself (e.g. round numbers "
            "beyond the plausible range).",
        )
    else:
        finding = Finding(
            check="bin_edges",
            verdict="review",
            item="bin edges",
            message="it is not recorded whether the bin edges came from the data (then they "
            "reveal the minimum and maximum); an output checker must look at them.",
        )
    return [Located(None, None, finding)]


def histogram_findings(output: TableOutput, rs: RuleSet) -> list[Located]:
    """All histogram checks."""
    counts = matrix(output.facts.cells.counts, np.int64)
    out = threshold(output, counts, rs, "records")
    if rs.zeros_disclosive and counts.size:
        out += locate(
            output,
            released_mask(output) & _interior_empty(counts, _bin_axis(output, counts)),
            "zeros",
            "withhold",
            "{cell} is an empty bin between non-empty ones: it tells that nobody has a value in "
            "that range. Use wider bins.",
        )
    return out + bin_edges(output, rs)
