"""Re-deriving logged decisions from the logged facts and the logged rule set.

Pure Python (the client stays light): the core output checks are recomputed from the facts the
server logged with each decision — threshold (records, or contributor units when declared) on
every released cell, N-K dominance and the p-ratio from the dominance shares, residual degrees of
freedom of models — with the parameters of the rule set whose contents were logged under the
decision's hash. Any finding these rules make is a reason the output should not have been
released automatically. Findings of other checks (reconstruction, class disclosure, query-set
auditing, leverage, DP) are checked through the logged findings themselves: the logged verdict
must be the combination of the logged findings, and a release may not carry a withhold finding
or a feature's withhold verdict.
"""

from __future__ import annotations

from typing import Any

_RANK = {"release": 0, "review": 1, "withhold": 2}


def combine(verdicts: list[str]) -> str:
    """Withhold beats review beats release (the rules engine's combination)."""
    return max(verdicts, key=lambda v: _RANK.get(v, 2), default="release")


def _cells(matrix: Any) -> list[tuple[int, int, Any]]:
    if not isinstance(matrix, list):
        return []
    return [
        (r, c, value)
        for r, row in enumerate(matrix)
        if isinstance(row, list)
        for c, value in enumerate(row)
    ]


def _at(matrix: Any, r: int, c: int, default: Any = None) -> Any:
    try:
        return matrix[r][c]
    except (TypeError, IndexError, KeyError):
        return default


def table_problems(facts: dict[str, Any], rules: dict[str, Any]) -> list[str]:
    threshold = int(rules.get("threshold", 10))
    problems: list[str] = []
    units = facts.get("contributors") if facts.get("statistic") != "count" else None
    for r, c, count in _cells(facts.get("counts")):
        if _at(facts.get("suppressed"), r, c, False):
            continue
        if not isinstance(count, int) or count <= 0:
            continue
        behind = _at(units, r, c, count) if units is not None else count
        if isinstance(behind, int) and behind < threshold:
            problems.append(
                f"cell ({r}, {c}) rests on {behind} units, below the threshold {threshold}"
            )
    nk_n, nk_k = int(rules.get("nk_n", 2)), float(rules.get("nk_k", 0.9))
    p_ratio = float(rules.get("p_ratio", 0.1))
    for r, c, shares in _cells(facts.get("dominance_shares")):
        if _at(facts.get("suppressed"), r, c, False) or _at(facts.get("negative"), r, c, False):
            continue
        count = _at(facts.get("counts"), r, c, 0)
        if not isinstance(count, int) or count <= 0 or not isinstance(shares, list):
            continue
        share = shares[nk_n - 1] if len(shares) >= nk_n else None
        if isinstance(share, (int, float)) and share >= nk_k:
            problems.append(
                f"cell ({r}, {c}): the {nk_n} largest contributors hold {share:.1%} "
                f"(limit {nk_k:.0%})"
            )
        ratio = _at(facts.get("p_ratio"), r, c)
        if isinstance(ratio, (int, float)) and ratio < p_ratio:
            problems.append(f"cell ({r}, {c}): p-ratio {ratio:.3f} below {p_ratio}")
    return problems


def fact_problems(facts: dict[str, Any] | None, rules: dict[str, Any]) -> list[str]:
    """What the core rules find in the logged facts of one output."""
    if not facts:
        return []
    kind = facts.get("output")
    if kind == "table":
        return table_problems(facts, rules)
    if kind == "regression":
        dof = int(rules.get("dof", 10))
        df_resid = facts.get("df_resid")
        if isinstance(df_resid, (int, float)) and df_resid < dof:
            return [f"the model has {df_resid:g} residual degrees of freedom, below {dof}"]
    return []


def feature_withholds(checks: dict[str, Any]) -> list[str]:
    """Other features' logged facts (qss, leverage, withhold budget, DP, ...) that say withhold:
    by convention a feature's facts carry a `verdict` (or `admitted: false`)."""
    found = []
    for key, value in checks.items():
        if isinstance(value, dict) and (
            value.get("verdict") == "withhold" or value.get("admitted") is False
        ):
            found.append(f"{key} decided withhold")
    return found
