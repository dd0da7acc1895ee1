"""Magnitude tables, means and totals (DwB classes 2 and 5): threshold, dominance, negatives.

Sources: DwB/SDAP guidelines (at least 10 units, dominance of the largest contributors); ACRO's
encoding and defaults (`NKCheck`: the N largest contributions make up >= k of the cell total,
N = 2, k = 0.9; `PPercentCheck`: (total - top1 - top2) / top1 < p, p = 0.10; negative values send
dominance to review; optional review of cells with missing values); Eustat's use of the p % rule
for establishment tables (PSD 2022, Miranda et al., section 1.3).

The threshold counts distinct contributor units when the dataset declares a unit column (two
records of one employer are one contributor). A mean is checked as its numerator (the total:
dominance) and its denominator (the count: threshold). A cell whose contributions are all zero
is withheld: the released total then tells every contributor's value.
"""

from __future__ import annotations

import numpy as np

from safeaccess.rules.checks.cells import Located, locate, matrix, released_mask
from safeaccess.rules.checks.frequency import threshold, zeros
from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import TableOutput
from safeaccess.rules.ruleset import RuleSet


def top_array(top: list[list[list[float]]], shape: tuple[int, int]) -> np.ndarray:
    """Per-cell largest contributions as an (R, C, 3) array padded with zeros."""
    arr = np.zeros((*shape, 3), dtype=float)
    for i, row in enumerate(top):
        for j, cell in enumerate(row):
            k = min(len(cell), 3)
            if k:
                arr[i, j, :k] = cell[:k]
    return arr


def dominance(
    output: TableOutput,
    counts: np.ndarray,
    top: np.ndarray,
    total: np.ndarray,
    negative: np.ndarray,
    rs: RuleSet,
) -> list[Located]:
    """N-K and p-ratio dominance, all-zero totals and negative contributions, per released cell."""
    shown = released_mask(output) & (counts > 0)
    out = locate(
        output,
        shown & negative,
        "negative_values",
        rs.negative_values,
        "{cell} has negative contributions, for which dominance rules are not defined: "
        "an output checker must judge whether one contributor dominates it.",
    )
    ok = shown & ~negative
    topn = top[:, :, : rs.nk_n].sum(axis=2)
    top1, top2 = top[:, :, 0], top[:, :, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        nk_share = np.where(total > 0, topn / total, 0.0)
        pval = np.where(top1 > 0, (total - top1 - top2) / top1, np.inf)
    out += locate(
        output,
        ok & (total > 0) & (nk_share >= rs.nk_k),
        "nk_dominance",
        "withhold",
        f"{{cell}}: the {rs.nk_n} largest contributors make up {{pct}}% of the total (limit "
        f"{rs.nk_k:.0%}), so the released figure reveals what they contribute. Combine cells.",
        {"pct": np.floor(nk_share * 1000) / 10},
    )
    out += locate(
        output,
        ok & (top1 > 0) & (pval < rs.p_ratio),
        "p_ratio",
        "withhold",
        "{cell}: the others besides the two largest contributors add only {pct}% of the "
        f"largest (at least {rs.p_ratio:.0%} needed), so the second largest could estimate "
        "the largest closely. Combine cells.",
        {"pct": np.floor(np.where(np.isfinite(pval), pval, 0) * 1000) / 10},
    )
    out += locate(
        output,
        ok & (total == 0) & (top1 == 0),
        "all_zero",
        "withhold",
        "every contribution to {cell} is zero, so the released figure tells each "
        "contributor's value.",
    )
    return out


def counted_findings(output: TableOutput, rs: RuleSet) -> tuple[list[Located], np.ndarray]:
    """The threshold (on contributors when the dataset names them) and zeros checks every
    table of a statistic of a value gets, with the cell counts they used."""
    cells = output.facts.cells
    counts = matrix(cells.counts, np.int64)
    units = matrix(cells.contributors, np.int64) if cells.contributors is not None else None
    out = threshold(
        output,
        units if units is not None else counts,
        rs,
        "contributors" if units is not None else "records",
    )
    out += zeros(output, counts, rs)
    return out, counts


def magnitude_findings(output: TableOutput, rs: RuleSet) -> list[Located]:
    """All magnitude-table checks on a sum or mean table."""
    cells = output.facts.cells
    out, counts = counted_findings(output, rs)
    if cells.top is None or cells.total is None:
        out.append(
            Located(
                None,
                None,
                Finding(
                    check="facts_missing",
                    verdict="review",
                    message="the largest contributions per cell were not recorded, so dominance "
                    "could not be checked automatically; an output checker must review it.",
                ),
            )
        )
    else:
        negative = (
            matrix(cells.negative, bool)
            if cells.negative is not None
            else np.zeros(counts.shape, dtype=bool)
        )
        out += dominance(
            output,
            counts,
            top_array(cells.top, counts.shape),
            matrix(cells.total, float),
            negative,
            rs,
        )
    if rs.missing_values == "review" and cells.missing is not None:
        missing = matrix(cells.missing, np.int64)
        out += locate(
            output,
            released_mask(output) & (missing > 0),
            "missing_values",
            "review",
            "{cell}: {m} records with a missing value were left out of the calculation; an "
            "output checker will confirm this is what you intended.",
            {"m": missing},
        )
    return out
