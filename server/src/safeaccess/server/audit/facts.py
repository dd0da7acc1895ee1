"""The facts behind a decision, as logged for auditors: counts, degrees of freedom, dominance
shares — numbers the checks compare with the rule set, never records or raw contributions.

The runner's full output keeps the largest individual contributions per cell (the checks need
them); the log keeps only their shares of the cell total and the p-ratio, which is what the
dominance rules compare and does not reveal any contributor's value.
"""

from __future__ import annotations

import math
from typing import Any


def _share(part: float, total: float) -> float | None:
    return part / total if total > 0 else None


def _table_facts(output: dict[str, Any]) -> dict[str, Any]:
    cells = output["facts"]["cells"]
    facts: dict[str, Any] = {
        "output": "table",
        "source": output.get("source"),
        "statistic": output.get("statistic"),
        "counts": cells["counts"],
        "contributors": cells.get("contributors"),
        "suppressed": output.get("suppressed"),
        "negative": cells.get("negative"),
        "n_total": output["facts"].get("n_total"),
    }
    top, total = cells.get("top"), cells.get("total")
    if output.get("statistic") != "count" and top is not None and total is not None:
        shares: list[list[list[float | None]]] = []
        p_ratio: list[list[float | None]] = []
        for top_row, total_row in zip(top, total, strict=True):
            share_row: list[list[float | None]] = []
            p_row: list[float | None] = []
            for contributions, cell_total in zip(top_row, total_row, strict=True):
                padded = [*contributions, 0.0, 0.0, 0.0][:3]
                cumulative = [sum(padded[: i + 1]) for i in range(3)]
                share_row.append([_share(c, cell_total) for c in cumulative])
                first, second = padded[0], padded[1]
                ratio = (cell_total - first - second) / first if first > 0 else None
                p_row.append(ratio if ratio is None or math.isfinite(ratio) else None)
            shares.append(share_row)
            p_ratio.append(p_row)
        facts["dominance_shares"] = shares  # cumulative shares of the 1, 2, 3 largest
        facts["p_ratio"] = p_ratio
    return facts


def _regression_facts(output: dict[str, Any]) -> dict[str, Any]:
    f = output["facts"]
    return {
        "output": "regression",
        "family": output.get("family"),
        "n": f["n"],
        "df_resid": f["df_resid"],
        "df_model": f["df_model"],
        "saturated": f.get("saturated"),
        "regressors": [
            {k: r.get(k) for k in ("term", "binary", "ones", "zeros")}
            for r in f.get("regressors", [])
        ],
    }


def _summary_facts(output: dict[str, Any]) -> dict[str, Any]:
    groups = output["facts"]["groups"]
    return {
        "output": "summary",
        "n_total": output["facts"].get("n_total"),
        "groups": [
            {
                "labels": g["labels"],
                "n": g["n"],
                "variables": {
                    name: {"n": v["n"], "n_distinct": v.get("n_distinct")}
                    for name, v in g["variables"].items()
                },
            }
            for g in groups
        ],
    }


def _model_facts(output: dict[str, Any]) -> dict[str, Any]:
    """What the model checks compared: leaf sizes (smallest per tree), the largest class share
    of any leaf, split sizes, structure, residual df and the membership-inference AUCs."""
    f = output["facts"]
    smallest: list[int] = []
    top_share = 0.0
    for tree in f.get("leaves", []):
        totals = [sum(row) for row in tree["counts"]]
        smallest.append(min(totals, default=0))
        for row, total in zip(tree["counts"], totals, strict=True):
            if total:
                top_share = max(top_share, max(row) / total)
    membership = f.get("membership") or {}
    return {
        "output": "model",
        "family": output.get("family"),
        "n_train": f.get("n_train"),
        "n_test": f.get("n_test"),
        "trees": len(smallest),
        "smallest_leaf": smallest,
        "largest_class_share": top_share,
        "depth": f.get("depth"),
        "n_leaves": f.get("n_leaves"),
        "features_used": f.get("features_used"),
        "df_resid": f.get("df_resid"),
        "membership": {
            k: membership.get(k)
            for k in ("loss_auc", "loss_auc_p_value", "worst_case_auc", "worst_case_auc_max")
        },
        "fairness": output.get("fairness"),
    }


def decision_facts(output: dict[str, Any] | None) -> dict[str, Any] | None:
    """The auditable facts of a full typed output (None when nothing was computed)."""
    if not output or "facts" not in output:
        return None
    kind = output.get("type")
    try:
        if kind == "table":
            return _table_facts(output)
        if kind == "regression":
            return _regression_facts(output)
        if kind == "summary":
            return _summary_facts(output)
        if kind == "model":
            return _model_facts(output)
        facts = output["facts"]
        # Other outputs: their sizes (n and group counts), which is what their checks compare.
        return {
            "output": kind,
            **{k: facts[k] for k in ("n", "group_counts", "n_total") if k in facts},
        }
    except (KeyError, TypeError, ValueError):
        return {"output": kind, "unreadable": True}
