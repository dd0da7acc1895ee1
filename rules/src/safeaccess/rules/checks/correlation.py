"""Correlation coefficients (DwB class 14).

Sources: DwB/SDAP guidelines: safe with at least 10 observations, except at rho = +-1 (one
variable is then an exact linear function of the other); a correlation between two binary
variables, with their means, determines their 2x2 table, which is checked as a frequency table.
ACRO applies its degrees-of-freedom rule; we take n - 2 as the degrees of freedom of a
correlation.
"""

from __future__ import annotations

import math

from safeaccess.rules.checks.leverage import leverage_findings
from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import CorrelationOutput
from safeaccess.rules.ruleset import RuleSet

_ONE = 1.0 - 1e-9  # float noise: a computed |rho| this close to 1 is an exact relationship


def small_table_findings(name: str, table: list[list[int]], rs: RuleSet) -> list[Finding]:
    """Threshold and zero checks on a small contingency table implied by another output."""
    out: list[Finding] = []
    for i, row in enumerate(table):
        for j, n in enumerate(row):
            cell = f"{name} cell ({i + 1}, {j + 1})"
            if 0 < n < rs.threshold:
                out.append(
                    Finding(
                        check="threshold",
                        verdict="withhold",
                        item=cell,
                        message=f"{cell} of the implied table rests on {n} records; at least "
                        f"{rs.threshold} are needed.",
                    )
                )
            elif n == 0 and rs.zeros_disclosive:
                out.append(
                    Finding(
                        check="zeros",
                        verdict="withhold",
                        item=cell,
                        message=f"{cell} of the implied table is empty: it tells that nobody "
                        "has this combination.",
                    )
                )
    return out


def correlation_findings(output: CorrelationOutput, rs: RuleSet) -> list[Finding]:
    """Observations, degrees of freedom, perfect correlations, binary-by-binary tables and the
    leverage of the simple regressions each pair gives."""
    f = output.facts
    out: list[Finding] = []
    if f.n < rs.threshold or f.n - 2 < rs.dof:
        out.append(
            Finding(
                check="dof",
                verdict="withhold",
                item="correlation matrix",
                message=f"the correlations rest on {f.n} records ({f.n - 2} degrees of freedom);"
                f" at least {max(rs.threshold, rs.dof + 2)} records are needed.",
            )
        )
    names = output.variables
    for i, row in enumerate(output.matrix):
        for j, rho in enumerate(row):
            if j <= i or rho is None or math.isnan(rho):
                continue
            if abs(rho) >= _ONE:
                out.append(
                    Finding(
                        check="perfect_correlation",
                        verdict="withhold",
                        item=f"{names[i]} and {names[j]}",
                        message=f"{names[i]} and {names[j]} correlate perfectly ({rho:+.0f}), "
                        "so one reveals the other for every record.",
                    )
                )
    for pair, table in f.pair_tables.items():
        out += small_table_findings(f"table {pair.replace('|', ' by ')}", table, rs)
    # with the means and SDs, each coefficient gives the simple regressions of the pair
    out += leverage_findings(f.leverage, rs, "correlation matrix")
    return out
