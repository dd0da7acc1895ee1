"""What a researcher may be told about why a step was withheld or sent to review.

Rule findings are written for output checkers and may quote confidential numbers (for example the
count of a small cell). A researcher sees the check that fired, the cell or item it fired on, and a
fixed explanation of the check, never the finding's own message.
"""

from __future__ import annotations

from safeaccess.rules.decision import Decision
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


def researcher_reasons(decision: Decision) -> list[Reason]:
    """The findings of a decision, in a form that discloses nothing beyond the cell's name."""
    reasons: list[Reason] = []
    for finding in decision.findings:
        explanation = _EXPLANATIONS.get(finding.check)
        if explanation is None:
            # Unknown (newer) checks: name the check, say nothing about the numbers.
            prefix = finding.check.split("_")[0]
            explanation = _EXPLANATIONS.get(prefix, f"the {finding.check} check failed")
        reasons.append(
            Reason(
                check=finding.check,
                verdict=finding.verdict,
                item=finding.item,
                message=explanation,
            )
        )
    return reasons
