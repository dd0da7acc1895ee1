"""safeaccess output-checking rules: statistical disclosure control checks for released outputs.

Researcher-side use (as ACRO inside a TRE): `crosstab`, `pivot_table` and `check`.
Controller-side use: `safeaccess.rules.engine.check` / `mitigate` with a `RuleSet`.
"""

from safeaccess.rules.engine import DEFAULT_RULESET, RuleSet, check, mitigate
from safeaccess.rules.researcher import CheckedTable, crosstab, pivot_table
from safeaccess.rules.ruleset import RuleSetError, load_ruleset
from safeaccess.rules.tabulate import TabulationError, build_table

__all__ = [
    "DEFAULT_RULESET",
    "CheckedTable",
    "RuleSet",
    "RuleSetError",
    "TabulationError",
    "build_table",
    "check",
    "crosstab",
    "load_ruleset",
    "mitigate",
    "pivot_table",
]
