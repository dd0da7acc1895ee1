"""What a researcher may be told about why a step was withheld or sent to review.

This module is the one place that decides it. Rule findings are written for output checkers and
may quote confidential numbers; but even the *name* of a check that fired is a fact about the
data: a cell flagged by the zeros check is known to be empty, one flagged by the threshold check
to hold 1-9 records, and a failure such as "no records satisfy the filter" tells zero from one.
Asked in a binary search, each such distinction is a bit of confidential data per sequence.

So every withhold whose cause depends on the data (every rule check, and every failure of the
computation that the analysis and the published metadata alone do not decide, see
`failures.py`) shows the same single reason, with no check name, no cell and no count. Only
causes that follow from the analysis itself are named (a script's output always goes to a
person). A check this module does not know (one added later) gets the uniform reason too, so a
new check can never leak through here. Output checkers and the audit record see the findings.
"""

from __future__ import annotations

from safeaccess.rules.decision import Decision
from safeaccess.server.schemas import Reason

#: The one reason shown for every withhold that depends on the data.
WITHHELD = Reason(
    check="disclosure_control",
    verdict="withhold",
    item=None,
    message=(
        "the result could reveal information about individual records (one answer for every "
        "cause, so that it tells nothing about the data)"
    ),
)

#: The one reason shown for every review whose cause depends on the data.
REVIEWED = Reason(
    check="output_review",
    verdict="review",
    item=None,
    message="an output checker looks at this result before it can be released",
)

#: Checks whose firing is decided by the analysis alone (never by the data): named as they are.
_ANALYSIS_DECIDED: dict[str, Reason] = {
    "script": Reason(
        check="script",
        verdict="review",
        item=None,
        message="the output of a script is always checked by a person before release",
    ),
}


def researcher_reasons(decision: Decision) -> list[Reason]:
    """The reasons a researcher sees for a withheld or reviewed step's decision."""
    fired = [f for f in decision.findings if f.verdict != "release"]
    if decision.verdict == "release" or not fired:
        return []
    if all(f.check in _ANALYSIS_DECIDED for f in fired):
        seen: dict[str, Reason] = {}
        for finding in fired:
            seen.setdefault(finding.check, _ANALYSIS_DECIDED[finding.check])
        return list(seen.values())
    return [WITHHELD] if decision.verdict == "withhold" else [REVIEWED]


def script_reasons() -> list[Reason]:
    """What a researcher sees for a script step, whatever its run did."""
    return [_ANALYSIS_DECIDED["script"]]
