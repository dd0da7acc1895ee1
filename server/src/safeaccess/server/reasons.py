"""What a researcher may be told about why a step was withheld or sent to review.

Rule findings are written for output checkers and may quote confidential numbers (for example the
count of a small cell). Even naming the failing cell discloses something: a cell flagged by the
zeros check is known to be empty, one flagged by the threshold check to hold 1-9 records. So a
researcher sees, per check that fired, a fixed explanation and how many cells or items it fired
on, never which ones nor the finding's own message. Output checkers see everything.
"""

from __future__ import annotations

from safeaccess.rules.decision import Decision, Finding
from safeaccess.server.schemas import Reason

_EXPLANATIONS: dict[str, str] = {
    "threshold": "too few records (or contributors) behind this number",
    "dof": "too few residual degrees of freedom",
    "nk_dominance": "a few contributors dominate this total",
    "p_ratio": "the largest contribution could be estimated too closely (p% rule)",
    "zeros": "an empty cell reveals that nobody has this combination",
    "class_disclosure": "almost everyone in this row or column falls in one cell",
    "negative": "negative contributions make dominance checks unreliable",
    "missing": "missing values behind this cell need a person to check",
    "extremes": "minima and maxima are values of single records",
    "reconstruction": "the statistics released together determine the underlying records",
    "differencing": "combined with earlier releases this isolates a small group",
    "query_set": "combined with earlier releases this isolates a small group",
    "script": "the output of a script is always checked by a person",
    "survival": "too few records at risk or events at some time",
}


_SEVERITY = {"release": 0, "review": 1, "withhold": 2}


def _explain(check: str) -> str:
    explanation = _EXPLANATIONS.get(check)
    if explanation is None:
        # Unknown (newer) checks: name the check, say nothing about the numbers.
        explanation = _EXPLANATIONS.get(check.split("_")[0], f"the {check} check failed")
    return explanation


def researcher_reasons(decision: Decision) -> list[Reason]:
    """One reason per check that fired (in order of first firing), with a count of items."""
    grouped: dict[str, list[Finding]] = {}
    for finding in decision.findings:
        if finding.verdict != "release":
            grouped.setdefault(finding.check, []).append(finding)
    reasons = []
    for check, findings in grouped.items():
        verdict = max((f.verdict for f in findings), key=_SEVERITY.__getitem__)
        items = sum(1 for f in findings if f.item is not None)
        message = _explain(check)
        if items:
            message += f" ({items} {'cell or item' if items == 1 else 'cells or items'})"
        reasons.append(Reason(check=check, verdict=verdict, item=None, message=message))
    return reasons
