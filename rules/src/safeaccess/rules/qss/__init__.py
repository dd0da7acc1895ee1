"""Query-set auditing across every release of a scope (issue 8).

`admit(state, query_sets, policy)` folds the query sets behind one output into the scope's
state, or refuses them all. See docs/qss.md for what each mode guarantees.
"""

from __future__ import annotations

from safeaccess.rules.qss.admit import Admission, QuerySetError, WeightedSet, admit
from safeaccess.rules.qss.encoding import StateFormatError
from safeaccess.rules.qss.policy import AuditMode, AuditPolicy
from safeaccess.rules.qss.state import AuditState

__all__ = [
    "Admission",
    "AuditMode",
    "AuditPolicy",
    "AuditState",
    "QuerySetError",
    "StateFormatError",
    "WeightedSet",
    "admit",
]
