"""safeaccess output-checking rules: statistical disclosure control checks for released outputs.

Researcher-side use (as ACRO inside a TRE): `crosstab`, `pivot_table` and `check`.
Controller-side use: `safeaccess.rules.engine.check` / `mitigate` with a `RuleSet`.

Names are imported lazily, so `import safeaccess.rules.outputs` (the sandbox runner, the server's
models) does not pay for pandas and the check catalogue.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from safeaccess.rules.engine import DEFAULT_RULESET, RuleSet, check, mitigate
    from safeaccess.rules.researcher import CheckedTable, crosstab, pivot_table
    from safeaccess.rules.ruleset import RuleSetError, load_ruleset
    from safeaccess.rules.tabulate import TabulationError, build_table

_WHERE = {
    "DEFAULT_RULESET": "safeaccess.rules.engine",
    "RuleSet": "safeaccess.rules.engine",
    "check": "safeaccess.rules.engine",
    "mitigate": "safeaccess.rules.engine",
    "CheckedTable": "safeaccess.rules.researcher",
    "crosstab": "safeaccess.rules.researcher",
    "pivot_table": "safeaccess.rules.researcher",
    "RuleSetError": "safeaccess.rules.ruleset",
    "load_ruleset": "safeaccess.rules.ruleset",
    "TabulationError": "safeaccess.rules.tabulate",
    "build_table": "safeaccess.rules.tabulate",
}

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


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'safeaccess.rules' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
