"""Test statistics (DwB class 12): chi-square independence and two-sample t tests.

Sources: DwB/SDAP guidelines: test statistics are safe with at least 10 degrees of freedom; a
chi-square statistic with its table margins lets one rebuild a sparse table, so its contingency
table is checked as a frequency table (threshold, zeros) rather than by the test's own df, which
is (r-1)(c-1) and says nothing about the records behind it. ACRO checks `df` of tests.
"""

from __future__ import annotations

from safeaccess.rules.checks.correlation import small_table_findings
from safeaccess.rules.checks.leverage import leverage_findings
from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import TestOutput
from safeaccess.rules.ruleset import RuleSet


def stat_test_findings(output: TestOutput, rs: RuleSet) -> list[Finding]:
    """Group sizes, degrees of freedom (t tests) and the underlying table (chi-square)."""
    f = output.facts
    out: list[Finding] = []
    for group, n in f.group_counts.items():
        if n < rs.threshold:
            out.append(
                Finding(
                    check="threshold",
                    verdict="withhold",
                    item=group,
                    message=f"group {group} has {n} records; at least {rs.threshold} are needed.",
                )
            )
    if output.test == "t_two_sample" and output.df < rs.dof:
        out.append(
            Finding(
                check="dof",
                verdict="withhold",
                item="test",
                message=f"the test has {output.df:g} degrees of freedom; at least {rs.dof} are "
                "needed.",
            )
        )
    if f.table is not None:
        out += small_table_findings("contingency table", f.table, rs)
    if output.test == "t_two_sample":
        # the regression on the group indicator; without facts the group sizes above decide
        out += leverage_findings(f.leverage, rs, "test", required=False)
    return out
