"""Missing counts are counts: checked by the threshold rule like a table cell.

Every rule-checked answer says how many records it left out for a missing value
(`outputs.MissingCount`, per group where it is grouped). Such a count tells how many people of
a group did not answer, so it meets the frequency threshold like any cell: a count from 1 to
threshold - 1 is suppressed (shown as None, `suppressed` set); then, as in a table's secondary
suppression, the smallest shown counts are suppressed too until the suppressed ones hold at
least threshold records together. A suppressed count's records leave the missing query set, so
the query-set auditor neither admits nor is refused by a set that was never released; the
records of a shown count (0 or at least the threshold) are admitted with the answer's other
query sets (`facts.missing_query_sets`), so that differencing them with other releases is
audited like any release.

Suppression is automatic rather than a withhold: the researcher did not ask for the count, and a
sealed sequence ends at its first withhold. A suppressed count stays hidden only as long as no
other release determines it; that is the auditor's job, which sees the answer's own query sets
(the present records) and refuses a later output whose difference with them is small.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import MissingCount, Output, QuerySet, SummaryOutput, TableOutput
from safeaccess.rules.ruleset import RuleSet


def _small(count: int | None, rs: RuleSet) -> bool:
    return count is not None and 0 < count < rs.threshold


def suppress_small_missing(output: Output, rs: RuleSet) -> Output:
    """`output` with every missing count below the threshold suppressed and its records taken
    out of the missing query sets; unchanged (the same object) when none is small."""
    counts: list[MissingCount] | None = getattr(output, "missing", None)
    if not counts or not any(_small(m.count, rs) for m in counts):
        return output
    hidden = _hidden(counts, rs)
    released = [
        m.model_copy(update={"count": None, "suppressed": True}) if m.name in hidden else m
        for m in counts
    ]
    if isinstance(output, SummaryOutput):
        output = _hide_present_counts(output, [m for m in counts if m.name in hidden])
    elif isinstance(output, TableOutput):
        output = _whole_cells(output, hidden)
    facts: BaseModel = output.facts
    sets = [_drop(q, hidden) for q in getattr(facts, "missing_query_sets", [])]
    new_facts = facts.model_copy(update={"missing_query_sets": sets})
    return output.model_copy(update={"missing": released, "facts": new_facts})


def _hide_present_counts(output: SummaryOutput, hidden: list[MissingCount]) -> SummaryOutput:
    """A summary's n (and count statistic) of a variable in a group is the group's size less
    the group's missing count: the same fact, suppressed with it (issue 41). The group's size
    is often released elsewhere (a table, the catalogue's row count), so a shown n would give
    the suppressed count back. The variable's other statistics (mean, sd, quantiles, ...) do
    not give n by themselves, so for the auditor they are about the whole group: its missing
    records join the group's cell of the variable's query set, which then is a set the group's
    size already covers. A later output that releases the present records' count (a sum, a
    filter that drops the missing values, a fit) is then refused by the auditor as differing
    from the group by fewer than threshold records."""
    variables = [v.variable for v in output.groups[0].variables] if output.groups else []
    index = {repr(list(g.labels)): i for i, g in enumerate(output.groups)}
    cells: dict[tuple[int, int], str] = {}  # (variable, group) -> the missing count's label
    for m in hidden:
        if len(m.variables) == 1 and m.variables[0] in variables:
            g = index.get(repr(list(m.group)))
            if g is not None:
                cells[(variables.index(m.variables[0]), g)] = m.name
    if not cells:
        return output
    groups = []
    for g, group in enumerate(output.groups):
        summaries = []
        for v, summary in enumerate(group.variables):
            if (v, g) in cells:
                stats = dict(summary.stats)
                if "count" in stats:
                    stats["count"] = None
                summary = summary.model_copy(
                    update={"n": None, "n_suppressed": True, "stats": stats}
                )
            summaries.append(summary)
        groups.append(group.model_copy(update={"variables": summaries}))
    facts = output.facts
    present = [facts.query_set, *facts.extra_query_sets]
    missing_sets = facts.missing_query_sets
    for v, qs in enumerate(present):
        mine = {name: g for (var, g), name in cells.items() if var == v}
        if mine and qs is not None and qs.attached:
            present[v] = _restore(qs, mine, missing_sets)
    new_facts = facts.model_copy(update={"query_set": present[0], "extra_query_sets": present[1:]})
    return output.model_copy(update={"groups": groups, "facts": new_facts})


def _whole_cells(output: TableOutput, hidden: set[str]) -> TableOutput:
    """A magnitude table of means (sds, modes) releases no count: where a cell's missing count
    is suppressed, the cell's statistic is admitted over the whole cell, as a summary's with
    its n suppressed (a sum stays over the present records: with a mean of the same records it
    gives their count). The value's per-cell missing set comes first and is numbered like the
    body's cells (row-major); anything else is left as it is (over the present records: the
    auditor may refuse, never release wrongly)."""
    qs = output.facts.query_set
    sets = output.facts.missing_query_sets
    if (
        output.source != "magnitude_table"
        or output.statistic == "sum"
        or qs is None
        or not qs.attached
        or not sets
        or len(sets[0].labels) != len(qs.labels)
    ):
        return output
    cells = {label: c for c, label in enumerate(sets[0].labels) if label in hidden}
    if not cells:
        return output
    facts = output.facts.model_copy(update={"query_set": _restore(qs, cells, sets[:1])})
    return output.model_copy(update={"facts": facts})


def _restore(qs: QuerySet, cells: dict[str, int], missing_sets: list[QuerySet]) -> QuerySet:
    """`qs` with the records of each missing count named in `cells` put in that group's cell."""
    values = qs.to_array().copy()
    for m in missing_sets:
        if not m.attached:
            continue
        mask = m.to_array()
        for c, label in enumerate(m.labels):
            if label in cells:
                values[mask == c] = cells[label]
    out = QuerySet(labels=list(qs.labels), array=qs.array)
    out.attach(values)
    return out


def _hidden(counts: list[MissingCount], rs: RuleSet) -> set[str]:
    """The counts to suppress: every small one, then (secondary suppression) the smallest shown
    ones until the suppressed hold at least threshold records together. The shown counts and
    the answer's cells often partition the records a reader knows the size of (the catalogue
    publishes the dataset's), so one suppressed count alone would be their difference."""
    hidden = {m.name for m in counts if _small(m.count, rs)}
    total = sum(m.count or 0 for m in counts if m.name in hidden)
    shown = sorted(
        (m for m in counts if m.name not in hidden and m.count), key=lambda m: m.count or 0
    )
    for m in shown:
        if total >= rs.threshold:
            break
        hidden.add(m.name)
        total += m.count or 0
    return hidden


def _drop(qs: QuerySet, hidden: set[str]) -> QuerySet:
    """The query set without the records of its cells named in `hidden` (they become -1)."""
    cells = [i for i, label in enumerate(qs.labels) if label in hidden]
    if not cells or not qs.attached:
        return qs
    values = qs.to_array().copy()
    values[np.isin(values, cells)] = -1
    out = QuerySet(labels=list(qs.labels), array=qs.array)
    out.attach(values)
    return out


def missing_findings(output: Output, rs: RuleSet) -> list[Finding]:
    """A note for the suppressed missing counts; a withhold for a small one left shown (an
    output that did not go through `suppress_small_missing`)."""
    counts: list[MissingCount] = getattr(output, "missing", None) or []
    found: list[Finding] = []
    for m in counts:
        if _small(m.count, rs):
            found.append(
                Finding(
                    check="missing_threshold",
                    verdict="withhold",
                    item=m.name,
                    message=f"{m.count} records left out for a missing value is below the "
                    f"threshold of {rs.threshold}.",
                )
            )
    n = sum(1 for m in counts if m.suppressed)
    if n:
        found.append(
            Finding(
                check="missing_suppressed",
                verdict="release",
                message=f"{n} count(s) of records left out for a missing value were below the "
                f"threshold of {rs.threshold} and are not shown (fewer than {rs.threshold}, "
                "more than 0).",
            )
        )
    return found
