"""Survival tables (Kaplan-Meier), not a DwB class: SDAP and O'Keefe et al. (2012).

Each step of a survival curve is a small frequency table: the records at risk and the events at
that time. Both must reach the survival threshold, or a step reveals when one person had the
event (ACRO pools events until 10 have accumulated, `rounded_survival_fun`). Steps are checked
one by one; pool event times (e.g. by month) until every step passes.

The records censored between two steps are released too (the drop in the number at risk that
the events do not explain), so they are held to the same threshold when there are any: the
query-set auditor would refuse them otherwise, with a less helpful reason.
"""

from __future__ import annotations

from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import SurvivalOutput
from safeaccess.rules.ruleset import RuleSet


def survival_findings(output: SurvivalOutput, rs: RuleSet) -> list[Finding]:
    """At-risk and event counts per step, per curve."""
    t = rs.survival_threshold
    out: list[Finding] = []
    for curve in output.facts.curves:
        group = ", ".join(f"{v}={x}" for v, x in zip(output.by, curve.labels, strict=False))
        if not curve.steps and rs.zeros_disclosive:
            # An empty curve says that nobody in the group had the event: a zero cell.
            out.append(
                Finding(
                    check="survival_no_events",
                    verdict="withhold",
                    item=group or "all records",
                    message=f"no record in {group or 'the selection'} has an event, and an empty "
                    "curve says so. Merge groups or widen the filter.",
                )
            )
        for step in curve.steps:
            item = f"{group + ', ' if group else ''}time {step.time:g}"
            if step.at_risk < t:
                out.append(
                    Finding(
                        check="survival_at_risk",
                        verdict="withhold",
                        item=item,
                        message=f"at {item} only {step.at_risk} records are at risk; at least "
                        f"{t} are needed. Stop the curve earlier or pool time points.",
                    )
                )
            if 0 < step.events < t:
                out.append(
                    Finding(
                        check="survival_events",
                        verdict="withhold",
                        item=item,
                        message=f"the step at {item} rests on {step.events} events; at least "
                        f"{t} are needed. Pool event times (e.g. by month).",
                    )
                )
            if 0 < step.censored < t:
                out.append(
                    Finding(
                        check="survival_censored",
                        verdict="withhold",
                        item=item,
                        message=f"from {item} to the next step {step.censored} records are "
                        f"censored (the drop in the number at risk that the events do not "
                        f"explain); at least {t} are needed. Pool times with 'interval' or end "
                        "the curve earlier with 'max_time'.",
                    )
                )
    return out
