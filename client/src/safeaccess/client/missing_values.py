"""What a released answer says about the records it left out for a missing value.

Every rule-checked output carries `missing`: per group where the answer is grouped, the records
left out because a value the answer needs is missing (a released count, checked like any
count: below the centre's threshold it is suppressed and shows as None). No analysis imputes a
value, so `imputation` is always "none"; the frame, the card, the plot and the results folder
all say so through these helpers, so they cannot disagree.
"""

from __future__ import annotations

from typing import Any

#: No kind imputes: the answers are on the records whose values are present.
IMPUTATION = "none"


def missing_rows(out: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The output's missing counts as plain rows (variables, group, count, suppressed); None
    for an output that does not report them (DP answers carry a noisy `missing` component)."""
    if not out or not isinstance(out.get("missing"), list):
        return None
    return [
        {
            "variables": list(m["variables"]),
            "group": list(m.get("group") or []),
            "count": m.get("count"),
            "suppressed": bool(m.get("suppressed")),
        }
        for m in out["missing"]
    ]


def _one(row: dict[str, Any]) -> str:
    what = " + ".join(row["variables"])
    where = ", ".join("(missing)" if v is None else str(v) for v in row["group"])
    count = "suppressed (below the threshold)" if row["suppressed"] else str(row["count"])
    return f"{what}{f' | {where}' if where else ''}: {count}"


def missing_note(out: dict[str, Any] | None) -> str | None:
    """One line: the records left out per variable and group, and that nothing was imputed."""
    rows = missing_rows(out)
    if rows is None:
        return None
    if not rows:
        return f"records left out for a missing value: none; imputation: {IMPUTATION}"
    return (
        "records left out for a missing value: "
        + "; ".join(_one(r) for r in rows)
        + f"; imputation: {IMPUTATION}"
    )
