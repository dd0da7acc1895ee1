"""Models that fit single records: the largest leverage (hat value) against a rule-set limit.

Why leverage: the fitted value of record i is h_i * y_i plus a combination of the other
responses, so a record with h_i near 1 is fitted (almost) exactly and its response can be read
back from the released estimates - the intercept plus 97 x slope of a regression on two ages,
one of them held by one person, is that person's income. Whether a model can do this is a
property of its design (and, for GLMs, of the fitted weights), not of the formula's shape, so
one check covers two-valued and few-valued numeric regressors, polynomials of degree d on d + 1
values, interactions and saturated categorical models alike (Belsley, Kuh and Welsch 1980 on
hat values; the DwB/SDAP guidelines' saturated-model and binary-regressor rules are special
cases).

The default limit is 1/threshold: a saturated model on groups of records fits each group's mean,
giving each record of a group of n the leverage 1/n, so the limit withholds exactly the models
whose smallest implied cell has fewer than `threshold` records - the threshold rule for tables.
"""

from __future__ import annotations

from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import LeverageFacts
from safeaccess.rules.ruleset import RuleSet

# float noise: a saturated group of exactly `threshold` records computes to 1/threshold +- 1e-16
_TOLERANCE = 1e-9


def leverage_findings(
    facts: LeverageFacts | None, rs: RuleSet, item: str, *, required: bool = True
) -> list[Finding]:
    """Withhold when some record's leverage exceeds the rule set's limit.

    Without facts the output goes to review when `required` (nothing else shows that no record
    is fitted exactly); a t test passes `required=False`, its group sizes give the same answer.
    """
    limit = rs.leverage_limit_value
    if limit >= 1.0:
        return []
    if facts is None:
        if not required:
            return []
        return [
            Finding(
                check="leverage",
                verdict="review",
                item=item,
                message=f"the {item} came without the leverage of its records, so a person must "
                "check that it does not fit any record exactly.",
            )
        ]
    if facts.max <= limit + _TOLERANCE:
        return []
    over, at_least = facts.count_over(limit + _TOLERANCE)
    records = f"{'at least ' if at_least else ''}{over} record{'s' if over != 1 else ''}"
    return [
        Finding(
            check="leverage",
            verdict="withhold",
            item=item,
            message=f"the {item} fits {records} almost exactly (largest leverage "
            f"{facts.max:.3g}, limit {limit:.3g}), so their values could be read back from it. "
            "Use more records per distinct value of the regressors, fewer terms, or coarser "
            "regressors.",
        )
    ]
