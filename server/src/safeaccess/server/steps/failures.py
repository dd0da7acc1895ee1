"""Which failures of a computation the researcher may see as failures.

A failure is an answer too. "No records satisfy the filter" for `age = 97 and income >= X` and a
threshold withhold for one matching record tell 0 from 1; a binary search over X then gives that
person's income exactly. `too_few_rows`, `singular`, `bad_group`, a time limit hit on a large
selection, a log() of a non-positive value "in the rows used": each depends on the records.

The rule: a failure stays a distinct failure only when the analysis and the published metadata
alone decide it. The server's own validation (`safeaccess.client.validation.validate`, run on the
metadata before the sandbox sees the analysis) catches unknown columns, bad formula and filter
syntax and type mismatches; those never reach the sandbox. Of what the runner reports, only the
codes listed in `DECIDABLE_RUNNER_CODES` are decided without data; every other code (known today
or added later) is treated as data-dependent and becomes a withhold that looks exactly like a
threshold withhold. The true cause is kept in the decision's findings for output checkers.
"""

from __future__ import annotations

from safeaccess.rules.decision import Decision, Finding
from safeaccess.rules.ruleset import RuleSet
from safeaccess.sandbox.failures import DECIDABLE_RUNNER_CODES

#: The check name under which a data-dependent failure is recorded for output checkers.
FAILURE_CHECK = "computation"


def is_data_dependent(runner_code: str) -> bool:
    """Whether a runner failure code may depend on the records (default: yes)."""
    return runner_code not in DECIDABLE_RUNNER_CODES


def failure_decision(code: str, message: str, ruleset: RuleSet) -> Decision:
    """A withhold decision recording a data-dependent failure's true cause (for checkers)."""
    return Decision(
        verdict="withhold",
        findings=[
            Finding(
                check=FAILURE_CHECK,
                verdict="withhold",
                message=f"the computation failed ({code}): {message}",
            )
        ],
        ruleset=ruleset.label,
        ruleset_hash=ruleset.content_hash(),
    )
