"""Mitigations a researcher requests in the analysis itself: suppression and rounding of tables.

They are bound in the sequence with the analysis (`Mitigations` in the analysis language), so a
controller never changes an output silently, and every mitigated output carries a finding that
says what was done.

Suppression (`suppress=True`):

1. primary: every body cell that a check would withhold is suppressed (value None, marked in
   `suppressed`);
2. secondary: while some row or column of the body has exactly one suppressed cell, the smallest
   non-empty released cell of that line is suppressed too, so the suppressed cell cannot be
   recovered by subtraction from a true total published elsewhere (the grand total, a one-way
   table). This is the ehrQL / tau-Argus lesson: primary suppression alone leaks;
3. margins are recomputed from the released body cells only (as ACRO does since its issue #198),
   so they add up to what is shown and reveal nothing about suppressed cells; a recomputed
   margin that fails a check itself is suppressed as well.

The facts of recomputed margins are derived from the released cells: counts and totals add up
exactly; the largest contributions of a margin are the largest among its cells' (exact when each
contributor lies in one cell); contributor counts are summed, which over-counts a unit present in
several cells, so the threshold on margins of unit-declared tables is a lower bound there.

Rounding (`round_to=b`) rounds every released value to the nearest multiple of `b` and rebuilds
count and sum margins from the rounded cells (means are rounded cell by cell). Rounding hides the
exact value of small counts and blurs differencing between overlapping tables; it does not make a
cell resting on few records safe (a rounded 5 may be 3 to 7 people, still a small group), nor a
dominated total, so all checks still run on the unrounded facts.
"""

from __future__ import annotations

import numpy as np

from safeaccess.rules.checks.cells import interior_mask, matrix
from safeaccess.rules.checks.tables import table_findings
from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import CellFacts, Output, QuerySet, TableOutput
from safeaccess.rules.ruleset import DEFAULT_RULESET, RuleSet


class MitigationError(ValueError):
    """A requested mitigation cannot be applied to this output."""


def mitigate(
    output: Output,
    ruleset: RuleSet | None = None,
    *,
    round_to: int | None = None,
    suppress: bool = False,
    suppress_review: bool = False,
) -> Output:
    """Apply the researcher's requested mitigations; without any, return the output unchanged.
    With `suppress_review` (an output checker's approval with suppression) the cells a check sends
    to review are suppressed too, not only those it would withhold.

    Raises `MitigationError` for a non-table output, a base below 1, or an output that was already
    mitigated (mitigations are applied once, by the controller, from the bound analysis).
    """
    if round_to is None and not suppress:
        return output
    if not isinstance(output, TableOutput):
        raise MitigationError(
            f"suppression and rounding apply to tables only, not to {output.type} outputs"
        )
    if round_to is not None and (isinstance(round_to, bool) or round_to < 1):
        raise MitigationError(f"the rounding base must be a positive integer, not {round_to!r}")
    if output.rounded_to is not None or (
        output.suppressed is not None and any(any(r) for r in output.suppressed)
    ):
        raise MitigationError("this table was already mitigated; mitigations apply once")
    table = output
    if suppress:
        table = _suppress(table, ruleset or DEFAULT_RULESET, suppress_review)
    if round_to is not None:
        table = _round(table, round_to)
    return table


def mitigation_notes(output: TableOutput) -> list[Finding]:
    """Findings that state the mitigations applied to a table (never silently)."""
    notes: list[Finding] = []
    if output.suppressed is not None:
        n = int(sum(sum(1 for s in row if s) for row in output.suppressed))
        if n:
            notes.append(
                Finding(
                    check="suppression",
                    verdict="release",
                    message=f"{n} cells were suppressed at your request (shown empty), including "
                    "cells suppressed only so that the others cannot be worked out from totals; "
                    "the totals shown were recomputed without them.",
                )
            )
    if output.rounded_to is not None:
        notes.append(
            Finding(
                check="rounding",
                verdict="release",
                message=f"values are rounded to the nearest multiple of {output.rounded_to} at "
                "your request. Rounding hides exact small values but does not make a small or "
                "dominated cell safe, so the checks apply to the unrounded figures.",
            )
        )
    return notes


def _body_bounds(output: TableOutput, shape: tuple[int, int]) -> tuple[int, int]:
    inner = interior_mask(output, shape)
    rows = int(inner.any(axis=1).sum()) if shape[1] else shape[0]
    cols = int(inner.any(axis=0).sum()) if shape[0] else shape[1]
    return rows, cols


def secondary_suppression(counts: np.ndarray, sup: np.ndarray) -> np.ndarray:
    """Extend `sup` (the primary suppression of a table body's `counts`) until no row or column
    of length > 1 has exactly one suppressed cell: the cells `suppress=True` leaves out. The
    query-set auditor's reserved standard tables (`server/qss/reserved.py`) use it too, so the
    table a scope reserves is the one a researcher asking for suppression is released."""
    return _secondary(counts, sup)


def _secondary(counts: np.ndarray, sup: np.ndarray) -> np.ndarray:
    """Extend `sup` until no row or column of length > 1 has exactly one suppressed cell."""
    sup = sup.copy()
    changed = True
    while changed:
        changed = False
        for axis in (1, 0):
            lines = sup if axis == 1 else sup.T
            vals = counts if axis == 1 else counts.T
            if lines.shape[1] < 2:
                continue
            for k in np.nonzero(lines.sum(axis=1) == 1)[0]:
                open_cells = ~lines[k]
                positive = open_cells & (vals[k] > 0)
                pool = positive if positive.any() else open_cells
                cand = np.where(pool, vals[k], np.iinfo(np.int64).max)
                j = int(np.argmin(cand))
                if axis == 1:
                    sup[k, j] = True
                else:
                    sup[j, k] = True
                changed = True
    return sup


def _merge_top(tops: list[list[float]]) -> list[float]:
    merged = sorted((x for t in tops for x in t), reverse=True)
    return merged[:3]


def _suppress(output: TableOutput, rs: RuleSet, suppress_review: bool = False) -> TableOutput:
    # `suppress_review`: an output checker approving a table sent to review suppresses the cells
    # flagged for review as well (a researcher's own request suppresses what would be withheld).
    primary_verdicts = ("withhold", "review") if suppress_review else ("withhold",)
    cells = output.facts.cells
    counts = matrix(cells.counts, np.int64)
    shape = counts.shape
    rb, cb = _body_bounds(output, shape)
    primary = np.zeros((rb, cb), dtype=bool)
    for loc in table_findings(output, rs):
        if (
            loc.finding.verdict in primary_verdicts
            and loc.row is not None
            and loc.col is not None
            and loc.row < rb
            and loc.col < cb
        ):
            primary[loc.row, loc.col] = True
    sup_body = _secondary(counts[:rb, :cb], primary)
    sup = np.zeros(shape, dtype=bool)
    sup[:rb, :cb] = sup_body
    shown = ~sup_body

    values: list[list[float | None]] = [list(r) for r in output.values]
    for i, j in zip(*np.nonzero(sup_body), strict=True):
        values[int(i)][int(j)] = None

    new_cells = cells.model_copy(deep=True)
    has_row_margin, has_col_margin = rb < shape[0], cb < shape[1]
    margin_cells: list[tuple[int, int, np.ndarray]] = []
    if has_col_margin:
        for i in range(rb):
            sel = np.zeros((rb, cb), dtype=bool)
            sel[i, :] = True
            margin_cells.append((i, shape[1] - 1, sel & shown))
    if has_row_margin:
        for j in range(cb):
            sel = np.zeros((rb, cb), dtype=bool)
            sel[:, j] = True
            margin_cells.append((shape[0] - 1, j, sel & shown))
    if has_row_margin and has_col_margin:
        margin_cells.append((shape[0] - 1, shape[1] - 1, shown.copy()))
    body_counts = counts[:rb, :cb]
    for i, j, sel in margin_cells:
        n = int(body_counts[sel].sum())
        new_cells.counts[i][j] = n
        value = _recompute(output, cells, sel, n, new_cells, i, j)
        values[i][j] = value
        if n == 0:
            sup[i, j] = True
            values[i][j] = None
    facts = output.facts.model_copy(
        update={
            "cells": new_cells,
            "n_total": int(body_counts[shown].sum()),
            "query_set": _drop_records(output.facts.query_set, sup_body),
        }
    )
    out = output.model_copy(update={"values": values, "suppressed": sup.tolist(), "facts": facts})
    # a recomputed margin can itself fail (e.g. dominance of a different mix of cells): hide it
    failing = [
        (loc.row, loc.col)
        for loc in table_findings(out, rs)
        if loc.finding.verdict == "withhold" and loc.row is not None and loc.col is not None
    ]
    if failing:
        for i, j in failing:
            sup[i, j] = True
            values[i][j] = None
        out = out.model_copy(update={"values": values, "suppressed": sup.tolist()})
    return out


def _recompute(
    output: TableOutput,
    cells: CellFacts,
    sel: np.ndarray,
    n: int,
    new_cells: CellFacts,
    i: int,
    j: int,
) -> float | None:
    """Recompute one margin cell's facts and value from the released body cells `sel`."""
    idx = [(int(a), int(b)) for a, b in zip(*np.nonzero(sel), strict=True)]
    if new_cells.contributors is not None and cells.contributors is not None:
        new_cells.contributors[i][j] = sum(cells.contributors[a][b] for a, b in idx)
    if new_cells.missing is not None and cells.missing is not None:
        new_cells.missing[i][j] = sum(cells.missing[a][b] for a, b in idx)
    if new_cells.negative is not None and cells.negative is not None:
        new_cells.negative[i][j] = any(cells.negative[a][b] for a, b in idx)
    if new_cells.top is not None and cells.top is not None:
        new_cells.top[i][j] = _merge_top([cells.top[a][b] for a, b in idx])
    total: float | None = None
    if new_cells.total is not None and cells.total is not None:
        total = float(sum(cells.total[a][b] for a, b in idx))
        new_cells.total[i][j] = total
    if output.statistic == "count":
        return float(n)
    if output.statistic in ("std", "mode"):
        return None  # not a function of the released cells: the margin is not released
    if total is None:
        # without per-cell totals, add up the released values (sum tables only)
        shown_vals = [output.values[a][b] for a, b in idx]
        if output.statistic == "sum":
            return float(sum(v for v in shown_vals if v is not None))
        return None
    if output.statistic == "sum":
        return total
    missing = new_cells.missing[i][j] if new_cells.missing is not None else 0
    valid = n - missing
    return total / valid if valid > 0 else None


def _drop_records(qs: QuerySet | None, sup_body: np.ndarray) -> QuerySet | None:
    """Records in suppressed cells are no longer behind any released aggregate."""
    if qs is None or not qs.attached or len(qs.labels) != sup_body.size:
        return qs
    index = qs.to_array().copy()
    hidden = np.flatnonzero(sup_body.ravel())
    index[np.isin(index, hidden)] = -1
    return QuerySet.from_array(qs.labels, index)


def _round(output: TableOutput, base: int) -> TableOutput:
    vals = np.array([[np.nan if v is None else v for v in row] for row in output.values], float)
    vals = vals.reshape(len(output.values), -1)
    rounded = np.floor(vals / base + 0.5) * base
    rb, cb = _body_bounds(output, vals.shape)
    if output.statistic in ("count", "sum") and (rb, cb) != vals.shape:
        body = np.where(np.isnan(rounded[:rb, :cb]), 0.0, rounded[:rb, :cb])
        if cb < vals.shape[1]:
            rounded[:rb, -1] = body.sum(axis=1)
        if rb < vals.shape[0]:
            rounded[-1, :cb] = body.sum(axis=0)
        if rb < vals.shape[0] and cb < vals.shape[1]:
            rounded[-1, -1] = body.sum()
        rounded[np.isnan(vals)] = np.nan
    values: list[list[float | None]] = [
        [None if np.isnan(x) else float(x) for x in row] for row in rounded.tolist()
    ]
    return output.model_copy(update={"values": values, "rounded_to": base})
