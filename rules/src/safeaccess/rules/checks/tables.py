"""Route a table to its check module (frequency, magnitude, std/mode or histogram)."""

from __future__ import annotations

from safeaccess.rules.checks.cells import Located
from safeaccess.rules.checks.frequency import frequency_findings
from safeaccess.rules.checks.histogram import histogram_findings
from safeaccess.rules.checks.magnitude import magnitude_findings
from safeaccess.rules.checks.table_stats import table_stat_findings
from safeaccess.rules.outputs import TableOutput
from safeaccess.rules.ruleset import RuleSet


def table_findings(output: TableOutput, rs: RuleSet) -> list[Located]:
    """Findings on a table with the (row, column) of the cell each concerns."""
    if output.source == "histogram":
        return histogram_findings(output, rs)
    if output.statistic == "count":
        return frequency_findings(output, rs)
    if output.statistic in ("std", "mode"):
        return table_stat_findings(output, rs)
    return magnitude_findings(output, rs)
