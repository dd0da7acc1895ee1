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


def cell_spread_and_mode(
    statistic: str, cell: Any, values: Any, ncells: int, contributor: Any = None
) -> tuple[np.ndarray, dict[str, list[Any]]]:
    """Per-cell standard deviation or mode of `values` and the facts their checks need.

    `cell` gives each record's cell index (-1: in no cell; a record may be listed once per cell
    it counts in, e.g. a body cell and its margins). Missing values are left out. "std" is the
    sample standard deviation (ddof 1, as pandas; NaN below two values), with the three largest
    squared deviations from the cell mean (summed per contributor unit where given) and their
    total; "mode" is the most frequent value, ties going to the smallest (ACRO picks one at
    random), with the number of records holding it. Computed here so the runner and the
    researcher-side tools agree.
    """
    c = np.asarray(cell, dtype=np.int64)
    v = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)
    ok = (c >= 0) & ~np.isnan(v)
    c, v = c[ok], v[ok]
    stat = np.full(ncells, np.nan)
    frame = pd.DataFrame({"c": c, "v": v})
    if statistic == "mode":
        sizes = frame.groupby(["c", "v"], sort=False).size().reset_index(name="k")
        sizes = sizes.sort_values(["c", "k", "v"], ascending=[True, False, True])
        first = sizes.drop_duplicates("c")
        stat[first.c.to_numpy()] = first.v.to_numpy()
        held = np.zeros(ncells, dtype=np.int64)
        held[first.c.to_numpy()] = first.k.to_numpy()
        return stat, {"mode_count": held.tolist()}
    if statistic != "std":
        raise ValueError(f"statistic {statistic!r} is neither 'std' nor 'mode'")
    grouped = frame.groupby("c", sort=False).v
    sd = grouped.std(ddof=1)
    stat[sd.index.to_numpy()] = sd.to_numpy()
    means = np.zeros(ncells)
    mean = grouped.mean()
    means[mean.index.to_numpy()] = mean.to_numpy()
    frame["d"] = (v - means[c]) ** 2
    if contributor is not None:
        units = pd.Series(np.asarray(contributor, dtype=object)[ok])
        frame["u"] = units.astype(str).to_numpy()
        frame = frame.groupby(["c", "u"], sort=False).d.sum().reset_index()
    total = np.zeros(ncells)
    summed = frame.groupby("c", sort=False).d.sum()
    total[summed.index.to_numpy()] = summed.to_numpy()
    top: list[list[float]] = [[] for _ in range(ncells)]
    largest = frame.sort_values(["c", "d"], ascending=[True, False]).groupby("c").head(3)
    for i, d in zip(largest.c.to_numpy(), largest.d.to_numpy(), strict=True):
        top[int(i)].append(float(d))
    return stat, {"deviation_top": top, "deviation_total": total.tolist()}
