"""Facts for summary checks, computed the same way wherever a summary is produced.

The sandbox runner fills `SummaryVariableFacts`; the dominance and extreme fields the checks use
are computed here so that the runner and the researcher-side tools agree:
`SummaryVariableFacts(n=..., n_distinct=..., **dominance_facts(values, contributor))`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from safeaccess.rules.outputs import SpreadFacts


def dominance_facts(values: Any, contributor: Any = None) -> dict[str, Any]:
    """Top-3 contributions, total, negatives, records at the extremes and contributor count.

    `values` are one group's values of one variable (missing values are counted and ignored).
    With `contributor` (one unit id per value) the top contributions are per-unit totals and
    `contributors` counts distinct units.
    """
    v = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)
    ok = ~np.isnan(v)
    x = v[ok]
    out: dict[str, Any] = {"missing": int((~ok).sum()), "negative": bool((x < 0).any())}
    if x.size == 0:
        out.update(top=[], total=0.0, n_at_min=0, n_at_max=0)
        return out
    out["total"] = float(x.sum())
    out["n_at_min"] = int((x == x.min()).sum())
    out["n_at_max"] = int((x == x.max()).sum())
    if contributor is not None:
        units = pd.Series(np.asarray(contributor))[ok]
        per_unit = pd.Series(x).groupby(units.to_numpy(), sort=False).sum().to_numpy()
        out["contributors"] = int(per_unit.size)
        contributions = per_unit
    else:
        contributions = x
    k = min(3, contributions.size)
    top = np.sort(np.partition(contributions, contributions.size - k)[-k:])[::-1]
    out["top"] = [float(t) for t in top]
    return out


def spread_facts(
    values: Any, contributor: Any = None, powers: tuple[int, ...] = (2, 3, 4)
) -> list[SpreadFacts]:
    """Per power r, the largest |y - mean|^r (per contributor unit where given) and their sum.

    Computed here so the runner and researcher-side tools agree; an empty list when fewer than
    two values are present.
    """
    v = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)
    ok = ~np.isnan(v)
    x = v[ok]
    if x.size < 2:
        return []
    dev = np.abs(x - x.mean())
    out: list[SpreadFacts] = []
    for r in powers:
        d = dev**r
        if contributor is not None:
            units = pd.Series(np.asarray(contributor))[ok].to_numpy()
            d = pd.Series(d).groupby(units, sort=False).sum().to_numpy()
        k = min(3, d.size)
        top = np.sort(np.partition(d, d.size - k)[-k:])[::-1]
        out.append(SpreadFacts(power=r, top=[float(t) for t in top], total=float(d.sum())))
    return out


def residual_spread(residuals: Any) -> SpreadFacts:
    """The three largest squared residuals of a fit and their sum (power 2)."""
    r2 = np.asarray(residuals, dtype=float) ** 2
    k = min(3, r2.size)
    top = np.sort(np.partition(r2, r2.size - k)[-k:])[::-1] if k else np.zeros(0)
    return SpreadFacts(power=2, top=[float(t) for t in top], total=float(r2.sum()))
