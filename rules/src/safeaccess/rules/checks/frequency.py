"""Frequency tables (DwB class 1): threshold, empty cells, class disclosure, margins.

Sources: DwB/SDAP output-checking guidelines (at least 10 units behind every cell; zeros and
near-100 % cells are class disclosure: no cell above 90 % of its row or column total), as ACRO
encodes them (`MinimumThresholdCheck`, `PresenceOfZeroCheck`); Eustat's criterion of 3 units for
small-area population tables (PSD 2022, Miranda et al., section 1.3) is a per-dataset override.

Margins are released numbers too, so the threshold applies to them; cells suppressed at the
researcher's request are not released and are not checked (margins are recomputed without them).
"""

from __future__ import annotations

import numpy as np

from safeaccess.rules.checks.cells import (
    Located,
    interior_mask,
    locate,
    matrix,
    released_mask,
)
from safeaccess.rules.outputs import TableOutput
from safeaccess.rules.ruleset import RuleSet


def threshold(output: TableOutput, counts: np.ndarray, rs: RuleSet, unit: str) -> list[Located]:
    """Withhold each released cell resting on fewer than `threshold` records (or units)."""
    mask = released_mask(output) & (counts > 0) & (counts < rs.threshold)
    return locate(
        output,
        mask,
        "threshold",
        "withhold",
        "{cell} rests on {n} " + unit + f"; at least {rs.threshold} are needed behind every "
        "released number. Merge categories or ask for suppression.",
        {"n": counts},
    )


def zeros(output: TableOutput, counts: np.ndarray, rs: RuleSet) -> list[Located]:
    """Withhold empty released cells when the rule set deems zeros disclosive."""
    if not rs.zeros_disclosive:
        return []
    mask = released_mask(output) & (counts == 0)
    return locate(
        output,
        mask,
        "zeros",
        "withhold",
        "{cell} is empty: it tells that nobody in the data has this combination. "
        "Merge categories or ask for suppression.",
    )


def class_disclosure(output: TableOutput, counts: np.ndarray, rs: RuleSet) -> list[Located]:
    """Withhold a body cell holding more than the allowed share of its row or column total.

    Shares use the true totals of the body (suppressed cells included), because the true totals
    are what a researcher could learn from other outputs.
    """
    limit = rs.class_disclosure
    if limit is None or counts.size == 0:
        return []
    inner = interior_mask(output, counts.shape)
    body = np.where(inner, counts, 0).astype(float)
    share = np.zeros_like(body)
    n_rows = int(inner.any(axis=1).sum())
    n_cols = int(inner.any(axis=0).sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        if n_cols > 1:
            row_tot = body.sum(axis=1, keepdims=True)
            share = np.maximum(share, np.where(row_tot > 0, body / row_tot, 0.0))
        if n_rows > 1:
            col_tot = body.sum(axis=0, keepdims=True)
            share = np.maximum(share, np.where(col_tot > 0, body / col_tot, 0.0))
    mask = inner & released_mask(output) & (body > 0) & (share > limit)
    return locate(
        output,
        mask,
        "class_disclosure",
        "withhold",
        "{cell} holds {pct}% of its row or column total (more than "
        f"{limit:.0%}): the table tells that almost everyone in that group shares this "
        "category. Merge categories or ask for suppression.",
        {"pct": np.round(share * 100).astype(int)},
    )


def frequency_findings(output: TableOutput, rs: RuleSet) -> list[Located]:
    """All frequency-table checks on a count table."""
    counts = matrix(output.facts.cells.counts, np.int64)
    return (
        threshold(output, counts, rs, "records")
        + zeros(output, counts, rs)
        + class_disclosure(output, counts, rs)
    )
