"""The leverage facts of a step, as recorded in its audit event (under the key `leverage`).

Only what the decision rested on: the largest hat value, how many records were above the limit
and the limit in force. Never which records, and nothing for outputs that are not models.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from safeaccess.rules.outputs import LeverageFacts
from safeaccess.rules.ruleset import RuleSet


def leverage_record(output: dict[str, Any] | None, ruleset: RuleSet) -> dict[str, Any] | None:
    """{"max", "n", "limit", "over", "over_at_least"} of a stored output, or None."""
    facts = ((output or {}).get("facts") or {}).get("leverage")
    if not isinstance(facts, dict):
        return None
    try:
        leverage = LeverageFacts.model_validate(facts)
    except ValidationError:
        return None
    limit = ruleset.leverage_limit_value
    over, at_least = leverage.count_over(limit)
    return {
        "max": leverage.max,
        "n": leverage.n,
        "limit": limit,
        "over": over,
        "over_at_least": at_least,
    }
