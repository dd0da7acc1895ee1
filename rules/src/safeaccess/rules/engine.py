"""The output-checking engine: `check(output, ruleset) -> Decision`.

CONTRACT used by the server pipeline: `check(output, ruleset=None)` checks one output on its own.
What outputs combined across releases reveal is the query-set auditor's job
(`safeaccess.rules.qss`), which the server runs after this check. `RuleSet`, `DEFAULT_RULESET`,
`check` and `mitigate` stay importable from this module.

Each output class is routed to its check module in `safeaccess.rules.checks`; every finding names
the cell or item it concerns. The verdict combines the findings: withhold beats review beats
release. Mitigations the researcher asked for are reported as findings too, never applied
silently.
"""

from __future__ import annotations

from safeaccess.rules.checks.cells import Located
from safeaccess.rules.checks.correlation import correlation_findings
from safeaccess.rules.checks.models import model_findings
from safeaccess.rules.checks.regression import regression_findings
from safeaccess.rules.checks.stattests import stat_test_findings
from safeaccess.rules.checks.summary import summary_findings
from safeaccess.rules.checks.survival import survival_findings
from safeaccess.rules.checks.tables import table_findings as _table_findings
from safeaccess.rules.decision import Decision, Finding, combine
from safeaccess.rules.missing import missing_findings
from safeaccess.rules.mitigation import MitigationError, mitigate, mitigation_notes
from safeaccess.rules.outputs import (
    CorrelationOutput,
    ModelOutput,
    Output,
    RegressionOutput,
    ScriptOutput,
    SummaryOutput,
    SurvivalOutput,
    TableOutput,
    TestOutput,
)
from safeaccess.rules.ruleset import DEFAULT_RULESET, RuleSet, RuleSetError, load_ruleset

__all__ = [
    "DEFAULT_RULESET",
    "MitigationError",
    "RuleSet",
    "RuleSetError",
    "check",
    "load_ruleset",
    "mitigate",
    "table_findings",
]


def table_findings(output: TableOutput, ruleset: RuleSet | None = None) -> list[Located]:
    """Findings on a table with the (row, column) of the cell each concerns."""
    return _table_findings(output, ruleset or DEFAULT_RULESET)


def _findings(output: Output, rs: RuleSet) -> list[Finding]:
    if isinstance(output, TableOutput):
        found = [loc.finding for loc in _table_findings(output, rs)]
        return found + mitigation_notes(output)
    if isinstance(output, SummaryOutput):
        return summary_findings(output, rs)
    if isinstance(output, RegressionOutput):
        return regression_findings(output, rs)
    if isinstance(output, CorrelationOutput):
        return correlation_findings(output, rs)
    if isinstance(output, TestOutput):
        return stat_test_findings(output, rs)
    if isinstance(output, SurvivalOutput):
        return survival_findings(output, rs)
    if isinstance(output, ModelOutput):
        return model_findings(output, rs)
    if isinstance(output, ScriptOutput):
        return [
            Finding(
                check="script",
                verdict="review",
                message="the output of a script is always checked by a person before release.",
            )
        ]
    return [
        Finding(
            check="unsupported_output",
            verdict="review",
            message=f"no automatic rules exist for outputs of type {type(output).__name__}; "
            "a person must check it.",
        )
    ]


def check(output: Output, ruleset: RuleSet | None = None) -> Decision:
    """Check one typed output against a rule set and decide release / withhold / review."""
    rs = ruleset or DEFAULT_RULESET
    findings = _findings(output, rs) + missing_findings(output, rs)
    return Decision(
        verdict=combine(findings),
        findings=findings,
        ruleset=rs.label,
        ruleset_hash=rs.content_hash(),
    )
