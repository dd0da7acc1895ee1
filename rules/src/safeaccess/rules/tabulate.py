"""Build a `TableOutput` with its checking facts from raw columns, vectorised with numpy.

`build_table` is the one place where a frequency or magnitude table and its facts (counts,
distinct contributors, top-3 contributions, totals, negatives, missing values, query set) are
computed. The researcher-side `crosstab` / `pivot_table` use it, and the sandbox runner can use it
so both sides agree cell for cell.

Why not `pd.crosstab`: it builds one groupby per statistic and is several times slower than
integer codes plus `np.bincount`; a checked table needs five statistics per cell. Keys are
factorised once (hash-based), the cell of each record is a mixed-radix code, every per-cell sum is
a `bincount`, and the largest contributions per cell come from `top3`: a cheap bound per cell
leaves only a few candidate records to sort (no sort of all records).

Layout follows `pd.crosstab(..., dropna=False)`: rows and columns are the Cartesian product of the
sorted observed levels of each variable (all categories for a pandas Categorical); records with a
missing key are left out; margins, when asked for, are the last row and column, labelled "All".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd

from safeaccess.rules.facts import cell_spread_and_mode
from safeaccess.rules.outputs import CellFacts, Label, QuerySet, TableFacts, TableOutput


class TabulationError(ValueError):
    """The columns given cannot form a table (lengths differ, non-numeric values ...)."""


def _codes(values: Any) -> tuple[np.ndarray, list[Label]]:
    """Integer codes (-1 for missing) and the sorted levels of one key variable."""
    s = values if isinstance(values, pd.Series) else pd.Series(np.asarray(values))
    if isinstance(s.dtype, pd.CategoricalDtype):
        codes = np.asarray(s.cat.codes, dtype=np.int64)
        levels = list(s.cat.categories.tolist())
    else:
        raw, uniques = pd.factorize(s, sort=True, use_na_sentinel=True)
        codes = raw.astype(np.int64, copy=False)
        levels = list(pd.Index(uniques).tolist())
    return codes, [_label(x) for x in levels]


def _numeric(values: Any) -> np.ndarray:
    """Values as float64, non-numeric entries as NaN (missing)."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "fiub":
        return values.astype(float, copy=False)
    return pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)


def _label(x: Any) -> Label:
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, str | int | float | bool) or x is None:
        return x
    return str(x)


def _combine(keys: Sequence[Any], n: int) -> tuple[np.ndarray, list[list[Label]], np.ndarray]:
    """Mixed-radix code over several key variables, their level product, and a validity mask."""
    if not keys:
        return np.zeros(n, dtype=np.int64), [[]], np.ones(n, dtype=bool)
    if len(keys) == 1:
        c, levels = _codes(keys[0])
        if len(c) != n:
            raise TabulationError(
                f"all columns must have the same length; got {len(c)} and {n} records"
            )
        return c, [[x] for x in levels], c >= 0
    code = np.zeros(n, dtype=np.int64)
    valid = np.ones(n, dtype=bool)
    level_lists: list[list[Label]] = []
    for key in keys:
        c, levels = _codes(key)
        if len(c) != n:
            raise TabulationError(
                f"all columns must have the same length; got {len(c)} and {n} records"
            )
        valid &= c >= 0
        code = code * max(len(levels), 1) + np.maximum(c, 0)
        level_lists.append(levels)
    labels: list[list[Label]] = [[]]
    for levels in level_lists:
        labels = [[*lab, x] for lab in labels for x in levels]
    return code, labels, valid


def top3(group: np.ndarray, v: np.ndarray, ngroups: int) -> np.ndarray:
    """The three largest values of `v` in each group (ties kept), as (ngroups, 3), zero-padded.

    For large inputs a cheap pass finds, per group, three values of three distinct records (the
    maxima of three interleaved slices); the smallest of them is a lower bound of the group's
    third-largest value, so only records at or above it can be in the top three. Those few
    candidates are sorted exactly. If ties make the candidates many, the exact passes run on them.
    """
    n = len(v)
    if n < 30_000 or ngroups == 0:
        return _top3_passes(group, v, ngroups)
    low = np.full(ngroups, np.inf)
    for k in range(3):
        m = np.full(ngroups, -np.inf)
        np.maximum.at(m, group[k::3], v[k::3])
        np.minimum(low, m, out=low)
    cand = np.flatnonzero(v >= low[group])
    g, x = group[cand], v[cand]
    if len(cand) > n // 8:
        return _top3_passes(g, x, ngroups)
    order = np.lexsort((-x, g))
    g, x = g[order], x[order]
    first = np.searchsorted(g, np.arange(ngroups))
    rank = np.arange(len(g)) - first[g]
    keep = rank < 3
    out = np.zeros((ngroups, 3), dtype=float)
    out[g[keep], rank[keep]] = x[keep]
    return out


def _top3_passes(group: np.ndarray, v: np.ndarray, ngroups: int) -> np.ndarray:
    """Exact top three per group by three passes of `np.maximum.at`.

    Each pass masks the previous maxima to -inf (no compaction): m1, m2, m3 are the three largest
    distinct values and t1, t2 how many records tie at m1 and m2; the top three follow from them.
    """
    out = np.zeros((ngroups, 3), dtype=float)
    if ngroups == 0 or len(v) == 0:
        return out
    x = v.astype(float, copy=True)
    maxima: list[np.ndarray] = []
    ties: list[np.ndarray] = []
    for _ in range(3):
        m = np.full(ngroups, -np.inf)
        np.maximum.at(m, group, x)
        at = (x == m[group]) & np.isfinite(x)
        maxima.append(m)
        ties.append(np.bincount(group, weights=at, minlength=ngroups))
        x[at] = -np.inf
    m1, m2, m3 = maxima
    t1, t2 = ties[0], ties[1]
    slot1 = np.where(t1 >= 2, m1, m2)
    slot2 = np.where(t1 >= 3, m1, np.where((t1 == 2) | (t2 >= 2), m2, m3))
    out[:, 0], out[:, 1], out[:, 2] = m1, slot1, slot2
    out[~np.isfinite(out)] = 0.0
    return out


def _merge_tops(tops: np.ndarray, axis: int) -> np.ndarray:
    """Top-3 of a row or column from its cells' top-3 (exact when each unit lies in one cell)."""
    moved = np.moveaxis(tops, axis, -2)  # (..., cells along axis, 3)
    flat = moved.reshape(*moved.shape[:-2], -1)
    return -np.sort(-flat, axis=-1)[..., :3]


def _unit_sums(
    cell: np.ndarray, v: np.ndarray, unit: np.ndarray, ncells: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per (cell, unit) totals and the cell of each pair; units are factorised codes."""
    nunits = int(unit.max()) + 1 if len(unit) else 1
    pair = cell * nunits + unit
    pcodes, uniq = pd.factorize(pair)
    sums = np.bincount(pcodes, weights=v, minlength=len(uniq))
    return np.asarray(uniq, dtype=np.int64) // nunits, sums


def _grid(flat: np.ndarray, nr: int, nc: int) -> np.ndarray:
    return flat.reshape(nr, nc)


def _with_margins(body: np.ndarray, how: Literal["sum", "any"]) -> np.ndarray:
    """Append a total column and row to a 2-D body (sum, or logical any)."""
    if how == "any":
        body_b = body.astype(bool)
        col = body_b.any(axis=1, keepdims=True)
        full = np.hstack([body_b, col])
        return np.vstack([full, full.any(axis=0, keepdims=True)])
    col = body.sum(axis=1, keepdims=True)
    full = np.hstack([body, col])
    return np.vstack([full, full.sum(axis=0, keepdims=True)])


def build_table(
    rows: Sequence[Any],
    cols: Sequence[Any] = (),
    *,
    row_names: Sequence[str] | None = None,
    col_names: Sequence[str] | None = None,
    values: Any = None,
    value_name: str | None = None,
    statistic: Literal["count", "sum", "mean", "std", "mode"] = "count",
    margins: bool = False,
    contributor: Any = None,
    source: Literal["frequency_table", "magnitude_table", "histogram", "contingency"] | None = None,
    query_set: bool = False,
    max_cells: int = 1_000_000,
) -> TableOutput:
    """Tabulate `rows` x `cols` (lists of equal-length arrays) into a checked-ready TableOutput.

    `statistic` "count" needs no values; "sum", "mean", "std" and "mode" aggregate `values`
    (missing values are left out and counted in `facts.cells.missing`; std and mode as
    `facts.cell_spread_and_mode` computes them). `contributor` (e.g. an employer id) makes the
    threshold count distinct units and the top contributions per-unit totals. With `query_set`
    the facts carry, per record, the index of its body cell (-1 when a key is missing).
    Tables of more than `max_cells` cells are refused before any memory is allocated for them.
    """
    if not rows:
        raise TabulationError("a table needs at least one row variable")
    n = len(rows[0])
    rcode, rlabels, rvalid = _combine(list(rows), n)
    ccode, clabels, cvalid = _combine(list(cols), n)
    nr, nc = len(rlabels), len(clabels)
    if nr * nc > max_cells:
        raise TabulationError(
            f"the table would have {nr * nc:,} cells (more than {max_cells:,}); "
            "use fewer or coarser variables"
        )
    valid = rvalid & cvalid
    cell_all = rcode * nc + ccode
    all_valid = bool(valid.all())
    cell = cell_all if all_valid else cell_all[valid]
    ncells = nr * nc
    counts = np.bincount(cell, minlength=ncells).astype(np.int64)

    cells_kw: dict[str, Any] = {}
    value_grid: np.ndarray
    if statistic == "count":
        if values is not None:
            raise TabulationError("a count table takes no values; use statistic 'sum' or 'mean'")
        value_grid = counts.astype(float)
    else:
        if values is None:
            raise TabulationError(f"statistic '{statistic}' needs a column of values")
        v_all = _numeric(values)
        if len(v_all) != n:
            raise TabulationError(f"values have {len(v_all)} records, the keys have {n}")
        v = v_all if all_valid else v_all[valid]
        ok = ~np.isnan(v)
        all_ok = bool(ok.all())
        cell_ok, v_ok = (cell, v) if all_ok else (cell[ok], v[ok])
        nvalid = np.bincount(cell_ok, minlength=ncells)
        total = np.bincount(cell_ok, weights=v_ok, minlength=ncells)
        neg = v_ok < 0
        negative = (
            np.bincount(cell_ok[neg], minlength=ncells) > 0
            if neg.any()
            else np.zeros(ncells, dtype=bool)
        )
        if contributor is not None:
            ucode, _ = _codes(contributor)
            if len(ucode) != n:
                raise TabulationError("the contributor column must have one entry per record")
            u = ucode if all_valid else ucode[valid]
            u = u if all_ok else u[ok]
            keep = u >= 0
            pair_cell, pair_sum = _unit_sums(cell_ok[keep], v_ok[keep], u[keep], ncells)
            tops = top3(pair_cell, pair_sum, ncells)
            units = np.bincount(pair_cell, minlength=ncells)
        else:
            pair_cell, pair_sum = cell_ok, v_ok
            tops = top3(cell_ok, v_ok, ncells)
            units = None
        missing = counts - nvalid
        if margins:
            tops_cells = tops.reshape(nr, nc, 3)
            top_full = np.zeros((nr + 1, nc + 1, 3))
            top_full[:nr, :nc] = tops_cells
            if contributor is None:
                top_full[:nr, nc] = _merge_tops(tops_cells, axis=1)
                top_full[nr, :nc] = _merge_tops(tops_cells, axis=0)
                top_full[nr, nc] = _merge_tops(top_full[:nr, nc][None, :, :], axis=1)[0]
            else:
                # per-unit totals of a margin must be summed over the unit's cells
                kc, kv, ku = cell_ok[keep], v_ok[keep], u[keep]
                ufull = np.zeros((nr + 1, nc + 1), dtype=np.int64)
                ufull[:nr, :nc] = _grid(units, nr, nc) if units is not None else 0
                pg, ps = _unit_sums(kc // nc, kv, ku, nr)
                top_full[:nr, nc] = top3(pg, ps, nr)
                ufull[:nr, nc] = np.bincount(pg, minlength=nr)
                pg, ps = _unit_sums(kc % nc, kv, ku, nc)
                top_full[nr, :nc] = top3(pg, ps, nc)
                ufull[nr, :nc] = np.bincount(pg, minlength=nc)
                pg, ps = _unit_sums(np.zeros(len(kc), dtype=np.int64), kv, ku, 1)
                top_full[nr, nc] = top3(pg, ps, 1)[0]
                ufull[nr, nc] = len(ps)
                cells_kw["contributors"] = ufull.tolist()
            total_g = _with_margins(_grid(total, nr, nc), "sum")
            nvalid_g = _with_margins(_grid(nvalid, nr, nc), "sum")
            cells_kw["top"] = top_full.tolist()
            cells_kw["total"] = total_g.tolist()
            cells_kw["negative"] = _with_margins(_grid(negative, nr, nc), "any").tolist()
            cells_kw["missing"] = _with_margins(_grid(missing, nr, nc), "sum").tolist()
        else:
            total_g = _grid(total, nr, nc)
            nvalid_g = _grid(nvalid, nr, nc)
            if units is not None:
                cells_kw["contributors"] = _grid(units, nr, nc).tolist()
            cells_kw["top"] = tops.reshape(nr, nc, 3).tolist()
            cells_kw["total"] = total_g.tolist()
            cells_kw["negative"] = _grid(negative, nr, nc).tolist()
            cells_kw["missing"] = _grid(missing, nr, nc).tolist()
        with np.errstate(divide="ignore", invalid="ignore"):
            if statistic == "sum":
                value_grid = np.where(nvalid_g > 0, total_g, np.nan)
            else:
                value_grid = np.where(nvalid_g > 0, total_g / nvalid_g, np.nan)
        if statistic in ("std", "mode"):
            keyed = None if contributor is None else np.asarray(contributor, dtype=object)
            if keyed is not None and not all_valid:
                keyed = keyed[valid]
            value_grid, more = _spread_or_mode(statistic, cell, v, nr, nc, margins, keyed)
            cells_kw.update(more)

    count_grid = _grid(counts, nr, nc)
    if margins:
        count_grid = _with_margins(count_grid, "sum")
        if statistic == "count":
            value_grid = count_grid.astype(float)
        rlabels = [*rlabels, ["All"]]
        clabels = [*clabels, ["All"]]
    elif statistic == "count":
        value_grid = count_grid.astype(float)

    qs = None
    if query_set:
        index = np.where(valid, cell_all, -1).astype(np.int32)
        names = [_flat_name(r, c) for r in rlabels[:nr] for c in clabels[:nc]]
        qs = QuerySet.from_array(names, index)
    vals: list[list[float | None]] = [
        [None if np.isnan(x) else x for x in row] for row in value_grid.tolist()
    ]
    return TableOutput(
        source=source or ("frequency_table" if statistic == "count" else "magnitude_table"),
        statistic=statistic,
        value=value_name,
        row_vars=list(row_names or [f"row_{i}" for i in range(len(rows))]),
        col_vars=list(col_names or [f"col_{i}" for i in range(len(cols))]),
        row_labels=rlabels,
        col_labels=clabels,
        values=vals,
        margins=margins,
        facts=TableFacts(
            cells=CellFacts(counts=count_grid.tolist(), **cells_kw),
            query_set=qs,
            n_total=int(valid.sum()),
        ),
    )


def _spread_or_mode(
    statistic: str,
    cell: np.ndarray,
    v: np.ndarray,
    nr: int,
    nc: int,
    margins: bool,
    contributor: Any,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Value grid and facts of a std or mode table; margins are computed from the records
    (neither statistic adds up from its cells)."""
    width = nc + 1 if margins else nc
    r, c = cell // nc, cell % nc
    places = [r * width + c]
    if margins:
        places += [r * width + nc, nr * width + c, np.full(len(cell), nr * width + nc)]
    units = None if contributor is None else np.concatenate([contributor] * len(places))
    height = nr + 1 if margins else nr
    stat, facts = cell_spread_and_mode(
        statistic, np.concatenate(places), np.concatenate([v] * len(places)), height * width, units
    )
    grid = stat.reshape(height, width)
    return grid, {
        k: [seq[i * width : (i + 1) * width] for i in range(height)] for k, seq in facts.items()
    }


def _flat_name(r: list[Label], c: list[Label]) -> str:
    return ", ".join(str(x) for x in [*r, *c])
