"""Summary statistics: means and totals (DwB class 5), extremes and percentiles (class 3),
mode (class 4), variance, SD, skewness and kurtosis (class 7), plus reconstruction risk.

Sources: DwB/SDAP guidelines: at least 10 units behind every statistic; means as magnitude tables
(dominance on the numerator); raw maxima and minima are not released (safe alternatives: a
top- or bottom-coded extreme shared by many records); each percentile must rest on at least 10
records (SDAP v2, which makes a median need 20 and quartiles 40); a mode is unsafe when every
unit shares it; higher moments need 10 degrees of freedom and a non-zero variance (a zero
variance tells that all values equal the mean). ACRO encodes these as the Position, Endpoints,
Mode and Shape statbarns. Exact reconstruction of small-scale data from the released
statistics (Derrick et al., PSD 2022) is checked by `safeaccess.rules.reconstruction`.
"""

from __future__ import annotations

from collections.abc import Sequence

from safeaccess.rules.decision import Finding, Verdict
from safeaccess.rules.outputs import (
    Label,
    SummaryGroupFacts,
    SummaryOutput,
    SummaryVariableFacts,
)
from safeaccess.rules.reconstruction.check import reconstruction_findings
from safeaccess.rules.ruleset import RuleSet

_MOMENTS = {"sd", "var", "skewness", "kurtosis"}
# The central moment each spread statistic is a magnitude over: sum |y - mean|^r.
_SPREAD_POWER = {"sd": 2, "var": 2, "skewness": 3, "kurtosis": 4}
_TOTALS = {"mean", "sum", "total"}


def _group_name(by: list[str], labels: list[Label]) -> str:
    return ", ".join(f"{v}={x}" for v, x in zip(by, labels, strict=False)) or "all records"


def _quantiles(stats: Sequence[str]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for s in stats:
        if s == "median":
            out.append((s, 0.5))
        elif s == "iqr":
            out += [(s, 0.25), (s, 0.75)]
        elif s.startswith("q"):
            try:
                out.append((s, float(s[1:])))
            except ValueError:
                continue
    return out


def variable_findings(
    item: str, stats: Sequence[str], f: SummaryVariableFacts, rs: RuleSet
) -> list[Finding]:
    """Checks on the statistics released about one variable in one group."""
    out: list[Finding] = []

    def add(check: str, message: str, verdict: Verdict = "withhold") -> None:
        out.append(Finding(check=check, verdict=verdict, item=item, message=message))

    units, what = (
        (f.contributors, "contributors") if f.contributors is not None else (f.n, "records")
    )
    if units < rs.threshold:
        add(
            "threshold",
            f"{item} rests on {units} {what}; at least {rs.threshold} are needed. "
            "Use broader groups.",
        )
        return out  # every other statistic of a too-small group is withheld with it
    names = set(stats)
    if names & _TOTALS and (f.top is None or f.total is None):
        add(
            "facts_missing",
            f"the largest values of {item} were not recorded, so whether one record dominates "
            "its mean could not be checked automatically; an output checker must review it.",
            "review",
        )
    elif names & _TOTALS and f.top is not None and f.total is not None:
        top = [*f.top, 0.0, 0.0, 0.0][:3]
        if f.negative:
            add(
                "negative_values",
                f"{item} has negative values, for which dominance rules are not defined: an "
                "output checker must judge whether one contributor dominates the mean.",
                rs.negative_values,
            )
        elif f.total > 0:
            share = sum(top[: rs.nk_n]) / f.total
            if share >= rs.nk_k:
                add(
                    "nk_dominance",
                    f"in {item} the {rs.nk_n} largest values make up {share:.1%} of the total "
                    f"(limit {rs.nk_k:.0%}), so the mean reveals what they are.",
                )
            if top[0] > 0 and (f.total - top[0] - top[1]) / top[0] < rs.p_ratio:
                add(
                    "p_ratio",
                    f"in {item} the values besides the two largest add up to less than "
                    f"{rs.p_ratio:.0%} of the largest, so the second largest could estimate it.",
                )
        elif f.total == 0:
            add("all_zero", f"every value in {item} is zero, so the mean tells each value.")
    if names & _MOMENTS:
        if f.n - 1 < rs.dof:
            add(
                "dof",
                f"{item}: {f.n - 1} degrees of freedom for the spread statistics; at least "
                f"{rs.dof} are needed.",
            )
        if f.variance_zero:
            add(
                "zero_variance",
                f"all values in {item} are equal, so a zero spread tells every record's value.",
            )
        out += _spread_findings(item, names, f, rs)
    asked = sum(1 for s in names if s.startswith("q"))
    if asked > rs.max_quantiles:
        add(
            "max_quantiles",
            f"{asked} quantiles of {item} were asked for; at most {rs.max_quantiles} may be "
            "released per summary.",
        )
    if _quantiles(stats) and (f.quantile_window is None or f.quantile_window < rs.threshold):
        add(
            "quantile_window",
            f"the quantiles of {item} were not each averaged over at least {rs.threshold} "
            "records around their position, so one could be a single record's value.",
        )
    for name, p in _quantiles(stats):
        support = round(min(p, 1.0 - p) * f.n, 9)  # 1 - 0.9 is 0.0999...: not a failure
        if support < rs.threshold:
            add(
                "quantile_support",
                f"{name} (p={p:g}) of {item} rests on about {support:.0f} records on its "
                f"smaller side; at least {rs.threshold} are needed on each side.",
            )
    for name, at in (("min", f.n_at_min), ("max", f.n_at_max)):
        if name in names and (at is None or at < rs.threshold):
            add(
                "extremes",
                f"the {'minimum' if name == 'min' else 'maximum'} of {item} is one record's "
                "raw value. Release it only top- or bottom-coded (shared by at least "
                f"{rs.threshold} records), or use percentiles.",
                rs.extremes,
            )
    if "mode" in names:
        out.extend(_mode_findings(item, f, rs))
    if rs.missing_values == "review" and f.missing:
        add(
            "missing_values",
            f"{f.missing} records of {item} had a missing value and were left out; an output "
            "checker will confirm this is what you intended.",
            "review",
        )
    return out


def _mode_findings(item: str, f: SummaryVariableFacts, rs: RuleSet) -> list[Finding]:
    """A mode is a record's value unless at least k records share it (as a mode table's cell).

    A mode every record shares tells each value; a mode held by fewer than `threshold` records
    is the value of those few: with all values distinct it is the lowest one, the raw minimum
    the extremes rule withholds.
    """
    if f.n_distinct <= 1 or (f.mode_share or 0.0) >= 1.0:
        message = f"every record in {item} has the modal value, so the mode tells each value."
        return [Finding(check="mode", verdict="withhold", item=item, message=message)]
    held = round((f.mode_share or 0.0) * f.n)  # the share is counts.max() / n: exact on rounding
    if held < rs.threshold:
        message = (
            f"the modal value of {item} is held by {held} records; at least {rs.threshold} are "
            "needed, or the mode is a value of those few. Use a coarser variable or a table."
        )
        return [Finding(check="mode_support", verdict="withhold", item=item, message=message)]
    return []


def _spread_findings(
    item: str, names: set[str], f: SummaryVariableFacts, rs: RuleSet
) -> list[Finding]:
    """Concentration of the spread: N-K dominance on the deviations |y - mean|^r.

    A released sd (r = 2), skewness (3) or kurtosis (4) with the count and mean tells
    sum |y - mean|^r; when the spread_n records farthest from the mean hold most of it, their
    deviation follows (a record holding a share s of sum (y - mean)^2 has |y - mean| within
    1 - sqrt(s) of sd * sqrt(n - 1)).
    """
    powers = sorted({_SPREAD_POWER[s] for s in names if s in _SPREAD_POWER})
    if not powers:
        return []
    by_power = {s.power: s for s in f.spread or []}
    out: list[Finding] = []
    for r in powers:
        facts = by_power.get(r)
        if facts is None:
            out.append(
                Finding(
                    check="facts_missing",
                    verdict="review",
                    item=item,
                    message=f"how concentrated the spread of {item} is was not recorded; an "
                    "output checker must judge whether one record dominates it.",
                )
            )
            continue
        if facts.total <= 0.0:
            continue  # a zero spread is the zero_variance check's business
        share = sum(facts.top[: rs.spread_n]) / facts.total
        if share >= rs.spread_k:
            what = {2: "squared deviations", 3: "cubed deviations", 4: "fourth-power deviations"}
            out.append(
                Finding(
                    check="spread_dominance",
                    verdict="withhold",
                    item=item,
                    message=f"in {item} the {rs.spread_n} records farthest from the mean hold "
                    f"{share:.1%} of the sum of {what[r]} (limit {rs.spread_k:.0%}), so the "
                    "spread statistics reveal how far they lie from the mean.",
                )
            )
    return out


def summary_findings(output: SummaryOutput, rs: RuleSet) -> list[Finding]:
    """All summary checks, per group and variable, then reconstruction risk."""
    facts: dict[str, SummaryGroupFacts] = {repr(g.labels): g for g in output.facts.groups}
    out: list[Finding] = []
    for group in output.groups:
        gname = _group_name(output.by, group.labels)
        gfacts = facts.get(repr(group.labels))
        for var in group.variables:
            item = f"{var.variable} in {gname}"
            vf = gfacts.variables.get(var.variable) if gfacts else None
            if vf is None:
                out.append(
                    Finding(
                        check="facts_missing",
                        verdict="review",
                        item=item,
                        message=f"no facts were recorded for {item}; an output checker must "
                        "review it.",
                    )
                )
                continue
            out += variable_findings(item, list(var.stats), vf, rs)
    if rs.reconstruction:
        out += reconstruction(output, rs)
    return out


def reconstruction(output: SummaryOutput, rs: RuleSet) -> list[Finding]:
    """Exact reconstruction risk (Derrick et al.), from `safeaccess.rules.reconstruction`."""
    return list(reconstruction_findings(output, rs))
