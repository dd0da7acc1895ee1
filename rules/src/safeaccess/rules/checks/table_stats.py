"""Standard deviations and modes per table cell (ACRO's pivot-table / crosstab `std` and `mode`).

ACRO (1.0.2) checks a `std` table with `MinimumDoFCheck` only (every cell's count - 1 at least
`safe_dof_threshold`), and a `mode` table with the zero checks only (`PresenceOfZeroCheck`; the
linked-table check is a note). We run those rules (`dof`; `zeros`) and are stricter where ACRO
lets a cell reveal individual values (DwB classes 4 and 7, as our summaries do):

- both: `threshold` on the records (or contributor units) behind each released cell;
- std: `zero_variance` (every value equal: a zero spread tells each one) and `spread_dominance`
  (the largest squared deviations make up most of their sum: the std reveals how far those
  records lie from the mean);
- mode: `mode` when every record shares the modal value (ACRO 0.4's "all values are the same"),
  and `mode_support` when fewer than `threshold` records hold it (the released value is then a
  value of those few records).
"""

from __future__ import annotations

import numpy as np

from safeaccess.rules.checks.cells import Located, locate, matrix, released_mask
from safeaccess.rules.checks.magnitude import counted_findings
from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import TableOutput
from safeaccess.rules.ruleset import RuleSet


def _facts_missing(what: str) -> Located:
    return Located(
        None,
        None,
        Finding(
            check="facts_missing",
            verdict="review",
            message=f"{what} per cell were not recorded, so the table could not be checked "
            "automatically; an output checker must review it.",
        ),
    )


def _std_findings(output: TableOutput, valid: np.ndarray, rs: RuleSet) -> list[Located]:
    cells = output.facts.cells
    shown = released_mask(output) & (valid > 0)
    out = locate(
        output,
        shown & (valid - 1 < rs.dof),
        "dof",
        "withhold",
        "{cell}: a standard deviation of {n} values has {df} degrees of freedom; at least "
        f"{rs.dof} are needed. Merge categories.",
        {"n": valid, "df": valid - 1},
    )
    if cells.deviation_top is None or cells.deviation_total is None:
        return [*out, _facts_missing("the spreads")]
    total = matrix(cells.deviation_total, float)
    top = np.zeros((*total.shape, rs.spread_n))
    for i, row in enumerate(cells.deviation_top):
        for j, cell in enumerate(row):
            k = min(len(cell), rs.spread_n)
            top[i, j, :k] = cell[:k]
    out += locate(
        output,
        shown & (valid >= 2) & (total <= 0),
        "zero_variance",
        "withhold",
        "all values in {cell} are equal, so a zero standard deviation tells every record's value.",
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(total > 0, top.sum(axis=2) / total, 0.0)
    out += locate(
        output,
        shown & (total > 0) & (share >= rs.spread_k),
        "spread_dominance",
        "withhold",
        f"in {{cell}} the {rs.spread_n} records farthest from the mean hold {{pct}}% of the sum "
        f"of squared deviations (limit {rs.spread_k:.0%}), so the standard deviation reveals how "
        "far they lie from the mean. Merge categories.",
        {"pct": np.floor(share * 1000) / 10},
    )
    return out


def _mode_findings(output: TableOutput, valid: np.ndarray, rs: RuleSet) -> list[Located]:
    cells = output.facts.cells
    if cells.mode_count is None:
        return [_facts_missing("the records at the mode")]
    held = matrix(cells.mode_count, np.int64)
    shown = released_mask(output) & (valid > 0)
    everyone = shown & (held >= valid)
    out = locate(
        output,
        everyone,
        "mode",
        "withhold",
        "every record in {cell} has the modal value, so the mode tells each record's value.",
    )
    out += locate(
        output,
        shown & ~everyone & (held < rs.threshold),
        "mode_support",
        "withhold",
        "{cell}: the modal value is held by {m} records; at least "
        f"{rs.threshold} are needed, or the mode is a value of those few. Merge categories.",
        {"m": held},
    )
    return out


def table_stat_findings(output: TableOutput, rs: RuleSet) -> list[Located]:
    """All checks on a table of standard deviations or modes."""
    cells = output.facts.cells
    out, counts = counted_findings(output, rs)
    missing = matrix(cells.missing, np.int64) if cells.missing is not None else 0
    valid = counts - missing
    if output.statistic == "std":
        out += _std_findings(output, valid, rs)
    else:
        out += _mode_findings(output, valid, rs)
    if rs.missing_values == "review" and cells.missing is not None:
        out += locate(
            output,
            released_mask(output) & (np.asarray(missing) > 0),
            "missing_values",
            "review",
            "{cell}: {m} records with a missing value were left out of the calculation; an "
            "output checker will confirm this is what you intended.",
            {"m": np.asarray(missing)},
        )
    return out
