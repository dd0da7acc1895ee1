"""The reconstruction-risk check on summary outputs, as the rules engine calls it.

For every group x variable on an ordinal or small-integer scale (facts carry `scale`), the
released statistics of that one output are turned into exact constraints on the unknown counts,
and the consistent samples are analysed:

- exactly one consistent sample: every value in the group can be worked out -> withhold;
- some value's count is the same in every consistent sample and lies in 1..threshold-1: the
  release implies a frequency cell below the threshold -> withhold;
- the question cannot be settled within the budget -> review by an output checker.

Where the `where` filter bounds the summarised variable, the facts carry per-record bounds
(`bounds`): the scale above is then the one the filter leaves (when it confines every record
of the group alike), and `bounds.py` checks how tightly the released mean fixes any one record
given the others' bounds, on any scale.

Statistics released in *different* outputs about the same group are not combined here: the server
keeps no list of earlier outputs (one mechanism across releases, the query-set auditor
`safeaccess.rules.qss`, which controls which record sets an aggregate may be taken over, not which
moments of one set are released). docs/rules.md says what this leaves open.

Settings read from the rule set (with these defaults when the rule set lacks them):
`threshold` (10), `reconstruction` (True: run the check), `reconstruction_max_steps`
(200 000 DP steps for the exact analysis of one group x variable), `reconstruction_search_steps`
(200 000 DP steps for each fallback search) and `reconstruction_time_budget` (2.0 seconds in all
for one group x variable: the exact analysis may use half of it, the searches the rest).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from safeaccess.rules.decision import Finding
from safeaccess.rules.outputs import (
    Label,
    SummaryOutput,
    SummaryVariableFacts,
    VariableSummary,
)
from safeaccess.rules.reconstruction._exact import (
    Admissible,
    ReconstructionError,
    windowed_median_weights,
    windowed_quantile_weights,
)
from safeaccess.rules.reconstruction.bounds import bounded_findings
from safeaccess.rules.reconstruction.matching import (
    BudgetExceeded,
    OrderConstraint,
    SampleConstraints,
    analyse,
    exists_consistent,
)
from safeaccess.rules.reconstruction.search import local_alternatives

if TYPE_CHECKING:
    from safeaccess.rules.ruleset import RuleSet

CHECK = "reconstruction"
DEFAULT_MAX_STEPS = 200_000
DEFAULT_SEARCH_STEPS = 200_000
DEFAULT_TIME_BUDGET = 2.0

# Statistics that constrain the sample here. Others (mode, skewness, kurtosis, iqr, count) are
# not used, so the check may under-state the risk of releasing them alongside these.
_USED = ("mean", "sd", "var", "median", "min", "max")


@dataclass(frozen=True)
class _Settings:
    threshold: int
    max_steps: int
    search_steps: int
    time_budget: float


def reconstruction_findings(output: SummaryOutput, ruleset: RuleSet | Any) -> list[Finding]:
    """Findings for groups x variables whose released statistics reveal values or small cells."""
    if not getattr(ruleset, "reconstruction", True):
        return []
    settings = _Settings(
        threshold=int(getattr(ruleset, "threshold", 10)),
        max_steps=int(getattr(ruleset, "reconstruction_max_steps", DEFAULT_MAX_STEPS)),
        search_steps=int(getattr(ruleset, "reconstruction_search_steps", DEFAULT_SEARCH_STEPS)),
        time_budget=float(getattr(ruleset, "reconstruction_time_budget", DEFAULT_TIME_BUDGET)),
    )
    findings: list[Finding] = []
    for gi, group in enumerate(output.groups):
        gfacts = _group_facts(output, gi, group.labels)
        if gfacts is None:
            continue
        for summary in group.variables:
            vfacts = gfacts.get(summary.variable)
            if vfacts is None:
                continue
            if vfacts.bounds:
                # any scale: what the mean fixes given the filter's bounds (bounds.py)
                item = f"{summary.variable} in {_group_name(output.by, group.labels)}"
                ratio = float(getattr(ruleset, "p_ratio", 0.1))
                findings.extend(bounded_findings(item, summary.stats, vfacts, output.round, ratio))
            if vfacts.scale is not None:
                findings.extend(_check_variable(output, group.labels, summary, vfacts, settings))
    return findings


def _check_variable(
    output: SummaryOutput,
    labels: list[Label],
    summary: VariableSummary,
    vfacts: SummaryVariableFacts,
    settings: _Settings,
) -> list[Finding]:
    assert vfacts.scale is not None
    low, high = vfacts.scale
    n = vfacts.n
    where = _group_name(output.by, labels)
    item = f"{where}, {summary.variable}"
    if n < 1 or high < low:
        return []  # nothing released about any record, or no usable scale
    truth = _true_counts(vfacts, low, high)
    try:
        cons = _constraints(summary.stats, low, high, n, output.round, output.quantile_type)
    except ReconstructionError as exc:
        return [
            Finding(
                check=CHECK,
                verdict="review",
                item=item,
                message=f"The released statistics of {summary.variable} in {where} could not be "
                f"checked for reconstruction ({exc}); an output checker needs to look.",
            )
        ]
    if cons is None:
        return []
    if truth is not None and not cons.admits(truth):
        return [
            Finding(
                check=CHECK,
                verdict="review",
                item=item,
                message=f"The released statistics of {summary.variable} in {where} could not be "
                f"reproduced from the data on the scale {low}-{high}; an output checker needs to "
                "confirm what they reveal.",
            )
        ]
    stats = _describe(summary.stats)
    context = ""
    try:
        verdict = _decide(cons, truth, settings)
    except BudgetExceeded:
        return [
            Finding(
                check=CHECK,
                verdict="review",
                item=item,
                message=f"Could not settle within the time allowed whether the released {stats} of "
                f"{summary.variable} in {where} (n={n}, scale {low}-{high}){context} reveal "
                "individual values; an output checker needs to look.",
            )
        ]
    if verdict.count == 0:
        return [
            Finding(
                check=CHECK,
                verdict="review",
                item=item,
                message=f"No sample on the scale {low}-{high} fits the released {stats} of "
                f"{summary.variable} in {where}{context}; an output checker needs to look.",
            )
        ]
    if verdict.count == 1:
        return [
            Finding(
                check=CHECK,
                verdict="withhold",
                item=item,
                message=f"The released {stats} of {summary.variable} in {where} (n={n}){context} "
                "fit only one possible set of values, so every individual value can be worked "
                "out. Release fewer statistics, round them more coarsely, or merge small groups.",
            )
        ]
    out = []
    for value, count in sorted(verdict.pinned_small.items()):
        records = "record has" if count == 1 else "records have"
        out.append(
            Finding(
                check=CHECK,
                verdict="withhold",
                item=f"{item}={value}",
                message=f"The released {stats} of {summary.variable} in {where}{context} imply "
                f"that exactly {count} {records} {summary.variable} = {value}, a cell below the "
                f"threshold of {settings.threshold}. Release fewer statistics, round them more "
                "coarsely, or merge categories or groups.",
            )
        )
    return out


@dataclass(frozen=True)
class _Verdict:
    count: int  # exact, or 2 meaning "at least two" on the search path
    pinned_small: dict[int, int]


def _decide(cons: SampleConstraints, truth: dict[int, int] | None, settings: _Settings) -> _Verdict:
    """Exact analysis when it fits the budget; otherwise targeted searches around the truth."""
    deadline = time.monotonic() + settings.time_budget
    try:
        result = analyse(cons, max_steps=settings.max_steps, time_budget=settings.time_budget / 2)
    except BudgetExceeded:
        if truth is None:
            raise
        return _search(cons, truth, settings, deadline)
    small = {v: c for v, c in result.pinned().items() if 0 < c < settings.threshold}
    return _Verdict(result.count, small)


def _search(
    cons: SampleConstraints, truth: dict[int, int], settings: _Settings, deadline: float
) -> _Verdict:
    """Decide with searches seeded by the true sample (which is always consistent).

    A value's count is pinned iff no consistent sample has a different count for it. Only
    values whose true count is below the threshold matter for cells; any other consistent
    sample proves there are at least two. Nearby samples are tried first (cheap); what they
    leave open goes to bounded exhaustive searches sharing what is left of the time budget.
    """
    low, n = cons.low, cons.n
    vector = [truth.get(v, 0) for v in range(low, cons.high + 1)]
    small = {v: c for v, c in truth.items() if 0 < c < settings.threshold}
    open_values = set(small)
    another = False
    for alt in local_alternatives(cons, vector):
        another = True
        open_values = {v for v in open_values if alt[v - low] == small[v]}
        if not open_values:
            break

    def exists(bounds: dict[int, tuple[int, int]]) -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BudgetExceeded("time budget exhausted")
        return exists_consistent(
            cons, bounds, max_steps=settings.search_steps, time_budget=left, hint=truth
        )

    def varies(v: int) -> bool:
        c = truth.get(v, 0)
        return (c > 0 and exists({v: (0, c - 1)})) or (c < n and exists({v: (c + 1, n)}))

    pinned = {v: small[v] for v in sorted(open_values) if not varies(v)}
    if another or len(pinned) < len(small):
        return _Verdict(2, pinned)
    for v in sorted(truth, key=lambda u: -truth[u]):
        if v not in small and varies(v):
            return _Verdict(2, pinned)
    return _Verdict(1, pinned)


def _constraints(
    stats: dict[str, float | None],
    low: int,
    high: int,
    n: int,
    decimals: int | None,
    qtype: int,
) -> SampleConstraints | None:
    """Exact constraints from released statistics; None if none of them constrains the sample."""
    means: list[Admissible] = []
    sds: list[Admissible] = []
    variances: list[Admissible] = []
    order: list[OrderConstraint] = []
    for name, value in stats.items():
        if value is None:
            continue
        try:
            adm = Admissible.released(value, decimals)
        except ReconstructionError:
            # more decimals than declared: treat as unrounded rather than guess
            adm = Admissible.released(value, None)
        if name == "mean":
            means.append(adm)
        elif name == "sd" and n >= 2:
            sds.append(adm)
        elif name == "var" and n >= 2:
            variances.append(adm)
        elif name == "median":
            order.append(OrderConstraint(name, windowed_median_weights(n), adm))
        elif name == "min":
            order.append(OrderConstraint(name, ((1, Fraction(1)),), adm))
        elif name == "max":
            order.append(OrderConstraint(name, ((n, Fraction(1)),), adm))
        elif name.startswith("q"):
            try:
                p = Fraction(name[1:])
            except ValueError:
                continue
            if 0 < p < 1:
                order.append(OrderConstraint(name, windowed_quantile_weights(n, p, qtype), adm))
    cons = SampleConstraints(low, high, n, tuple(means), tuple(sds), tuple(variances), tuple(order))
    return None if cons.is_empty() else cons


def _true_counts(vfacts: SummaryVariableFacts, low: int, high: int) -> dict[int, int] | None:
    """The actual value counts from the facts, when present and on the scale."""
    if not vfacts.value_counts:
        return None
    counts: dict[int, int] = {}
    for key, c in vfacts.value_counts.items():
        try:
            v = Fraction(key)
        except (ValueError, ZeroDivisionError):
            return None
        if v.denominator != 1 or not low <= v <= high:
            return None
        counts[int(v)] = counts.get(int(v), 0) + c
    return counts if sum(counts.values()) == vfacts.n else None


def _group_facts(
    output: SummaryOutput, index: int, labels: list[Label]
) -> dict[str, SummaryVariableFacts] | None:
    groups = output.facts.groups
    if index < len(groups) and groups[index].labels == labels:
        return groups[index].variables
    return next((g.variables for g in groups if g.labels == labels), None)


def _group_name(by: list[str], labels: list[Label]) -> str:
    if not by:
        return "the whole sample"
    return "group " + ", ".join(f"{b}={lab}" for b, lab in zip(by, labels, strict=False))


def _describe(stats: dict[str, float | None]) -> str:
    names = [
        {"sd": "SD", "var": "variance"}.get(k, "quantile " + k[1:] if k.startswith("q") else k)
        for k, v in stats.items()
        if v is not None and (k in _USED or k.startswith("q"))
    ]
    if len(names) <= 1:
        return "".join(names) or "statistics"
    return ", ".join(names[:-1]) + " and " + names[-1]
