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
from safeaccess.rules.outputs import MissingCount, Output, QuerySet
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
    facts: BaseModel = output.facts
    sets = [_drop(q, hidden) for q in getattr(facts, "missing_query_sets", [])]
    new_facts = facts.model_copy(update={"missing_query_sets": sets})
    return output.model_copy(update={"missing": released, "facts": new_facts})


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
