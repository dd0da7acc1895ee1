"""The withhold budget: how many withholds a researcher may receive on one dataset in a window.

Every withhold still tells a researcher one bit (this result was disclosive), and she may seal as
many sequences as she likes; so past `withhold_budget.count` withholds within the last
`withhold_budget.days` days on a dataset name (all its versions), a new sequence on it is not
run: it waits, `awaiting_approval`, until an output checker approves opening it (`safeaccess-server
review approve-opening`). Sequences still open on it count as possible withholds (each can end
in one: a withhold aborts it), so opening many sequences while the budget lasts and revealing
their disclosive steps later cannot overshoot it. The budget left is shown to the researcher: it is
made of her own withholds, which she has seen.
"""

from __future__ import annotations

from datetime import timedelta

from safeaccess.rules.ruleset import RuleSet
from safeaccess.server.schemas import BudgetView
from safeaccess.server.store import WithholdCount, review
from safeaccess.server.store.database import Database
from safeaccess.server.store.schema import utcnow


def budget(
    store: Database, ruleset: RuleSet, researcher: str, dataset: str, used: int | None = None
) -> BudgetView | None:
    """The budget's current state, or None when the rule set sets no budget; `used` is the
    withholds counted already (`count_at_settle`), else they are counted now."""
    rule = ruleset.withhold_budget
    if rule is None:
        return None
    if used is None:
        used, _ = review.withholds_since(
            store, researcher, dataset, utcnow() - timedelta(days=rule.days)
        )
    return BudgetView(
        dataset=dataset,
        count=rule.count,
        days=rule.days,
        used=used,
        remaining=max(0, rule.count - used),
    )


def count_at_settle(ruleset: RuleSet, researcher: str, dataset: str) -> WithholdCount | None:
    """The count `budget` needs, for a step's settle to make in its transaction (None when the
    rule set sets no budget)."""
    rule = ruleset.withhold_budget
    if rule is None:
        return None
    return WithholdCount(researcher, dataset, utcnow() - timedelta(days=rule.days))


def opening_needs_approval(
    store: Database, ruleset: RuleSet, researcher: str, dataset: str
) -> tuple[bool, dict[str, object] | None]:
    """Whether a new sequence must wait for approval, and the facts for the event log."""
    rule = ruleset.withhold_budget
    if rule is None:
        return False, None
    used, open_sequences = review.withholds_since(
        store, researcher, dataset, utcnow() - timedelta(days=rule.days)
    )
    held = used + open_sequences >= rule.count
    return held, {
        "count": rule.count,
        "days": rule.days,
        "used": used,
        "open_sequences": open_sequences,
        "remaining": max(0, rule.count - used),
        "awaiting_approval": held,
    }
