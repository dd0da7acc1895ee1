"""Build a `TableOutput` with its checking facts from key columns, vectorised with numpy.

`build_table` is the one place where a frequency or magnitude table and its facts (counts,
distinct contributors, top-3 contributions, totals, negatives, missing values, query set) are
computed: the researcher-side `crosstab` / `pivot_table` call it, and so do the sandbox's
frequency tables, magnitude tables and histograms (through `tabulate`, which also gives each
record's cell), so both sides agree cell for cell. The sandbox's grouped counts (summaries,
survival curves, tests) place their records through `group_cells`, on the same code path. What
the facts of a table are (margins, which facts each kind carries, released values) is described
once in `table_facts`, which the sandbox's DuckDB path uses too: here only the cells are counted
and summed.

Keys may arrive already coded (`Coded`): a histogram's bins, or a dataset version's stored code
arrays (`safeaccess.sandbox.codes`), which hold the server-rule codes of the whole dataset; for
those, `Coded.fixed` says how many levels are declared (always kept) and the rest are kept only
when a record in the selection has them, as coding the selection afresh would do.

Why not `pd.crosstab`: it builds one groupby per statistic and is several times slower than
integer codes plus `np.bincount`; a checked table needs five statistics per cell. Keys are coded
once to their distinct values (no hashing for Categoricals and small integer spans), each record
gets one joint (mixed-radix) code and one `bincount` counts every value combination (`_Placed`);
every per-cell sum is a `bincount` with weights, and the largest contributions per cell come from
`top3`: a cheap bound per cell leaves only a few candidate records to sort by (cell, -value) (no
sort of all records, no loop over cells).

Levels. Without `levels`, the layout follows `pd.crosstab(..., dropna=False)`: the sorted
observed levels of each variable (all categories for a pandas Categorical). With `levels` (the
server's rule, `code_levels`): the declared levels first, in declared order, kept even when no
record has them, then undeclared values in sorted order. Records with a missing key are in no
cell; in a magnitude table so are records whose value is missing (they are counted in
`missing`). Margins, when asked for, are a last row labelled "All" and, for a table with column
variables, a last column.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from safeaccess.rules.facts import cell_spread_and_mode
from safeaccess.rules.outputs import Label, QuerySet, TableOutput, cell_dtype
from safeaccess.rules.table_facts import (
    TOP_N,
    CellSums,
    Layout,
    Source,
    Statistic,
    TableShape,
    count_table,
    magnitude_table,
)


class TabulationError(ValueError):
    """The columns given cannot form a table (lengths differ, non-numeric values ...)."""


@dataclass(frozen=True)
class Coded:
    """A key variable coded as level indexes (-1 = missing) with its ordered levels."""

    name: str
    codes: np.ndarray
    levels: list[Label]
    #: None: every level is kept. Else the first `fixed` levels are kept and a later one only
    #: when some record has it (the server's rule for values no metadata declares).
    fixed: int | None = None


def declared_label(value: Any) -> Label:
    """A plain JSON-able label from a numpy/pandas scalar (whole floats become ints)."""
    if value is None:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    return str(value)


@dataclass(frozen=True)
class _Raw:
    """A key variable as codes into its distinct values (-1 = missing), before its levels are
    known: which values are levels can depend on which occur, and that is read off the table's
    own counts rather than from one more pass over the records per variable."""

    name: str
    codes: np.ndarray
    size: int  # codes are < size
    finish: Callable[[np.ndarray], tuple[np.ndarray, list[Label]]]  # occurs -> (to level, levels)


def _server_raw(values: Any, declared: Sequence[Label] | None, name: str = "") -> _Raw:
    """A key variable for the server's level rule (see `code_levels`)."""
    column = values if isinstance(values, pd.Series) else pd.Series(values)
    categorical = isinstance(column.dtype, pd.CategoricalDtype)
    if categorical:
        # A categorical already holds codes into its categories.
        raw = column.cat.codes.to_numpy()
        present = column.cat.categories
    else:
        raw, present = pd.factorize(column, use_na_sentinel=True)
    schema_levels: list[Any] = []
    if declared:
        schema_levels = list(declared)
    elif categorical:
        # A Parquet/pandas categorical carries its own ordered level list: use it, unused
        # categories included, as the design matrices do.
        schema_levels = [declared_label(c) for c in column.cat.categories]

    def finish(occurs: np.ndarray) -> tuple[np.ndarray, list[Label]]:
        levels: list[Label] = []
        index: dict[Any, int] = {}
        for level in schema_levels:
            if level not in index:
                index[level] = len(levels)
                levels.append(level)
        extra = []
        for value, seen in zip(present, occurs, strict=True):
            if not seen:
                continue  # a category no record has is a level only if declared
            label = declared_label(value)
            if label in index or str(label) in index:
                continue
            extra.append(label)
        try:
            extra.sort()
        except TypeError:
            extra.sort(key=str)
        for label in extra:
            index[label] = len(levels)
            levels.append(label)
        table = np.full(len(present), -1, dtype=np.int64)
        for i, (value, seen) in enumerate(zip(present, occurs, strict=True)):
            if seen:  # else never indexed: no record has this category
                label = declared_label(value)
                code = index.get(label)
                table[i] = index[str(label)] if code is None else code
        return table, levels

    return _Raw(name, raw, len(present), finish)


def _pandas_raw(values: Any, name: str = "") -> _Raw:
    """A key variable for pandas' level rule: the sorted observed values (all categories of a
    Categorical)."""
    s = values if isinstance(values, pd.Series) else pd.Series(np.asarray(values))
    if isinstance(s.dtype, pd.CategoricalDtype):
        levels = [_label(x) for x in s.cat.categories.tolist()]
        return _Raw(
            name, s.cat.codes.to_numpy(), len(levels), lambda _: (_identity(levels), levels)
        )
    array = s.to_numpy()
    if array.dtype.kind in "iu" and array.dtype != np.uint64 and len(array):
        lo, hi = int(array.min()), int(array.max())
        if hi - lo < max(1 << 16, 2 * len(array)):
            # A small span of integers: the values (shifted) are the codes; no hash, no sort.
            shifted = array if lo == 0 else array.astype(np.int64) - lo

            def by_value(occurs: np.ndarray) -> tuple[np.ndarray, list[Label]]:
                table = np.where(occurs, np.cumsum(occurs) - 1, -1)
                return table, [int(x) + lo for x in np.flatnonzero(occurs)]

            return _Raw(name, shifted, hi - lo + 1, by_value)
    # Sorting is done on the few distinct values, then mapped onto the records with one gather:
    # `factorize(sort=True)` would reorder the codes of every record through pandas' `take`.
    raw, uniques = pd.factorize(s, sort=False, use_na_sentinel=True)
    rank, ordered = pd.factorize(uniques, sort=True)
    levels = [_label(x) for x in pd.Index(ordered).tolist()]
    return _Raw(name, raw, len(uniques), lambda _: (rank.astype(np.int64), levels))


def _identity(levels: list[Label]) -> np.ndarray:
    return np.arange(len(levels), dtype=np.int64)


def _coded_raw(key: Coded) -> _Raw:
    if key.fixed is None or key.fixed >= len(key.levels):
        return _Raw(
            key.name, key.codes, len(key.levels), lambda _: (_identity(key.levels), key.levels)
        )
    fixed = key.fixed

    def observed(occurs: np.ndarray) -> tuple[np.ndarray, list[Label]]:
        keep = occurs.copy()
        keep[:fixed] = True
        table = np.where(keep, np.cumsum(keep) - 1, -1)
        return table, [lv for lv, k in zip(key.levels, keep.tolist(), strict=True) if k]

    return _Raw(key.name, key.codes, len(key.levels), observed)


def _occurs(codes: np.ndarray, size: int) -> np.ndarray:
    """Which of `size` values occur in `codes` (-1 = missing).

    Small code types are counted as unsigned, which sends the -1 of a missing value past the
    last value (pandas picks the narrowest type that holds a Categorical's categories): no
    masked copy.
    """
    if codes.dtype in (np.int8, np.int16) and size < (128 if codes.dtype == np.int8 else 32768):
        unsigned = codes.view(np.uint8 if codes.dtype == np.int8 else np.uint16)
        return np.bincount(unsigned, minlength=size)[:size] > 0
    return np.bincount(codes[codes >= 0], minlength=size)[:size] > 0


def _apply(table: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Level codes from value codes through `table` (-1 stays -1)."""
    if np.array_equal(table, np.arange(len(table))):
        return codes  # the levels are the values' own order: codes as they are
    return np.take(np.append(table, -1), codes)  # -1 indexes the appended -1


def code_levels(values: Any, declared: Sequence[Label] | None) -> tuple[np.ndarray, list[Label]]:
    """Codes (-1 = missing) and levels of a key variable by the server's rule.

    Declared levels (else the categories of a pandas Categorical) come first, in declared order,
    and are kept even when no record has them: empty cells matter for disclosure checks. Values
    not declared follow in sorted order.
    """
    raw = _server_raw(values, declared)
    table, levels = raw.finish(_occurs(raw.codes, raw.size))
    return _apply(table, raw.codes), levels


def _codes(values: Any) -> tuple[np.ndarray, list[Label]]:
    """Integer codes (-1 for missing) and the sorted levels of one key variable (pandas' rule)."""
    raw = _pandas_raw(values)
    table, levels = raw.finish(_occurs(raw.codes, raw.size))
    return _apply(table, raw.codes), levels


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


def _raw_key(values: Any, server_rule: bool, declared: Sequence[Label] | None) -> _Raw:
    """One key variable, by the server's level rule or pandas' (see the module)."""
    if isinstance(values, Coded):
        return _coded_raw(values)
    name = str(values.name) if isinstance(values, pd.Series) and values.name is not None else ""
    return _server_raw(values, declared, name) if server_rule else _pandas_raw(values, name)


def _combine(
    keys: Sequence[Coded], n: int
) -> tuple[np.ndarray | None, list[list[Label]], np.ndarray | None]:
    """Mixed-radix code over several key variables (None: no variable, all in code 0), their
    level product, and a validity mask (None: every record has every key)."""
    code: np.ndarray | None = None
    valid: np.ndarray | None = None
    labels: list[list[Label]] = [[]]
    for key in keys:
        if len(key.codes) != n:
            raise TabulationError(
                f"all columns must have the same length; got {len(key.codes)} and {n} records"
            )
        c = key.codes
        if n and int(c.min()) < 0:
            valid = c >= 0 if valid is None else valid & (c >= 0)
            c = np.maximum(c, 0)
        if code is None:
            code = c.astype(np.int64, copy=False)
        else:
            code = code * max(len(key.levels), 1) + c
        labels = [[*lab, x] for lab in labels for x in key.levels]
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


def _unit_codes(contributor: Any, n: int) -> np.ndarray:
    """Contributor unit per record as integer codes; a record whose unit is unknown is a unit of
    its own (it still contributes to the cell, so it must count as a contributor)."""
    codes, uniques = pd.factorize(pd.Series(np.asarray(contributor, dtype=object)))
    if len(codes) != n:
        raise TabulationError("the contributor column must have one entry per record")
    codes = codes.astype(np.int64, copy=False)
    unknown = codes < 0
    if unknown.any():
        codes[unknown] = len(uniques) + np.arange(int(unknown.sum()))
    return codes


def _own_units(contributor: Any) -> np.ndarray:
    """Contributor ids as objects, unknown ones replaced by a per-record id (for std tables,
    whose per-unit deviations group by the ids' text); the NUL byte keeps them apart from ids."""
    units = np.asarray(contributor, dtype=object).copy()
    unknown = pd.isna(units)
    units[unknown] = [f"\x00record{i}" for i in np.flatnonzero(unknown)]
    return units


def _unit_sums(group: np.ndarray, v: np.ndarray, unit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per (group, unit) totals and the group of each pair.

    pandas' grouped sum (compensated, in record order) rather than `bincount`, so that a unit's
    total is the same float whoever computes it.
    """
    if len(v) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    nunits = int(unit.max()) + 1
    sums = pd.Series(v).groupby(group * nunits + unit, sort=False).sum()
    return np.asarray(sums.index, dtype=np.int64) // nunits, sums.to_numpy(dtype=float)


def _largest(group: np.ndarray, v: np.ndarray, ngroups: int) -> tuple[np.ndarray, np.ndarray]:
    """The (up to) three largest values per group, -inf-padded, and how many each group has."""
    tops = top3(group, v, ngroups)
    k = np.minimum(np.bincount(group, minlength=ngroups), TOP_N)
    tops[np.arange(TOP_N)[None, :] >= k[:, None]] = -np.inf
    return tops, k


def _record_sums(cell: np.ndarray, v: np.ndarray, lay: Layout) -> Any:
    """The grid of per-cell sums of `v`, margins summed over their records (not their cells) in
    record order, so a total is the same float however the table is laid out."""
    body = np.bincount(cell, weights=v, minlength=lay.nr * lay.nc)
    if not lay.margins:
        return lay.grid(body)
    row = np.bincount(cell // lay.nc, weights=v, minlength=lay.nr)
    col = np.bincount(cell % lay.nc, weights=v, minlength=lay.nc)
    corner = np.bincount(np.zeros(len(cell), dtype=np.int64), weights=v, minlength=1)[0]
    return lay.grid(body, row, col, corner)


@dataclass(frozen=True)
class Tabulated:
    """A table, and `record_cells()`: per record, the index of the body cell it is counted in
    (-1: none), made only when asked for (a query set)."""

    output: TableOutput
    record_cells: Callable[[], np.ndarray]


def _masked_cells(cell_all: np.ndarray, inside: np.ndarray | None) -> Callable[[], np.ndarray]:
    if inside is None:
        return lambda: cell_all
    return lambda: np.where(inside, cell_all, -1)


class TooManyCells(TabulationError):
    """The table would have more than `max_cells` cells: `side` says which product is too
    large ("rows", "cols" or "table"), `names` its variables and `cells` its size."""

    def __init__(self, side: str, names: list[str], cells: int, message: str) -> None:
        super().__init__(message)
        self.side, self.names, self.cells = side, names, cells


# Largest product of distinct values (plus a missing slot each) counted in one `bincount` over
# the records; beyond it each variable is coded on its own first.
_JOINT_LIMIT = 1 << 22


class _Placed:
    """Where the records fall: the table's labels, its body counts and, on demand, each record's
    body cell.

    Usually every record gets one joint code over its variables' value codes (one pass, slice
    by slice), a `bincount` of those gives the counts of every value combination, which
    variable values occur is read off them, and the body counts follow on that small array:
    the records are passed over again (the joint codes made afresh) only when a per-record
    cell is needed (magnitudes, query sets). When the
    product of distinct values is too large for that, each variable is coded to its levels
    first and the cells combined per record.
    """

    def __init__(self, raws: list[_Raw], n_row_keys: int, n: int, max_cells: int) -> None:
        self.n = n
        self.joint_slices: Callable[[], Iterator[tuple[slice, np.ndarray]]] | None = None
        self.hist: np.ndarray | None = None
        self.to_cell: np.ndarray | None = None
        self.cell_all: np.ndarray | None = None
        self.valid: np.ndarray | None = None
        joint_size = int(np.prod([r.size + 1 for r in raws], dtype=np.float64))
        if joint_size <= min(max(1 << 20, n), _JOINT_LIMIT):
            # the narrowest integer type that holds the joint codes: fewer bytes to pass over
            width = np.int16 if joint_size < 1 << 15 else np.int32
            # A slice's counts are a `joint_size` array: slices no smaller than a few of them
            # (one slice when the joint is large).
            step = max(_SLICE, 4 * joint_size)
            self.joint_slices = lambda: _joint_slices(raws, n, width, step)
            hist = np.zeros(joint_size, dtype=np.int64)
            for _, codes in self.joint_slices():
                hist += np.bincount(codes, minlength=joint_size)
            shaped = hist.reshape([r.size + 1 for r in raws])
            finished = []
            for i, r in enumerate(raws):
                others = tuple(a for a in range(len(raws)) if a != i)
                finished.append(r.finish(shaped.sum(axis=others)[1:] > 0))
            self.hist = hist
        else:
            finished = [r.finish(_occurs(r.codes, r.size)) for r in raws]
        key_levels = [lv for _, lv in finished]
        self.key_levels = key_levels
        self.row_labels = _product(key_levels[:n_row_keys])
        self.col_labels = _product(key_levels[n_row_keys:])
        _check_size(raws, key_levels, n_row_keys, max_cells)
        nc = len(self.col_labels)
        self.ncells = len(self.row_labels) * nc
        if self.hist is not None:
            # in the query set's own cell type, so the per-record cells need no conversion
            self.to_cell = _joint_cells(raws, finished, n_row_keys, nc).astype(
                cell_dtype(self.ncells)
            )
            return
        coded = [
            Coded(r.name, _apply(table, r.codes), lv)
            for r, (table, lv) in zip(raws, finished, strict=True)
        ]
        rcode, _, rvalid = _combine(coded[:n_row_keys], n)
        ccode, _, cvalid = _combine(coded[n_row_keys:], n)
        self.cell_all = _cells(rcode, ccode, nc, n)
        self.valid = _both(rvalid, cvalid)

    def counts(self) -> np.ndarray:
        """Records per body cell (row-major)."""
        if self.hist is not None and self.to_cell is not None:
            ok = self.to_cell >= 0
            body = np.bincount(self.to_cell[ok], weights=self.hist[ok], minlength=self.ncells)
            return body.astype(np.int64)
        assert self.cell_all is not None
        return np.bincount(_pick(self.cell_all, self.valid), minlength=self.ncells)

    def per_record(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Each record's body cell by its keys, and which records have every key (None: all)."""
        if self.cell_all is None:
            assert self.to_cell is not None and self.joint_slices is not None
            # int64: magnitudes combine cells with unit codes and must not overflow
            cell = self._looked_up(self.to_cell.astype(np.int64))
            self.cell_all = cell
            self.valid = cell >= 0 if self.n and int(cell.min()) < 0 else None
        return self.cell_all, self.valid

    def _looked_up(self, table: np.ndarray) -> np.ndarray:
        """`table[joint code]` of every record, in `table`'s type."""
        assert self.joint_slices is not None
        out = np.empty(self.n, dtype=table.dtype)
        for part, codes in self.joint_slices():
            np.take(table, codes, out=out[part])
        return out

    def record_cells(self) -> np.ndarray:
        """Per record, its body cell (-1: a key is missing)."""
        if self.to_cell is not None and self.joint_slices is not None:
            return self._looked_up(self.to_cell)
        cell_all, valid = self.per_record()
        return _masked_cells(cell_all, valid)()


# Records per slice of the passes below. numpy's `bincount` and `take` turn narrow integer
# codes into a record-sized int64 array before they count or look up; slice by slice that copy
# stays in the cache and no record-sized temporary is allocated (page faults on fresh memory
# cost a 10 M-record table more than its arithmetic does).
_SLICE = 1 << 16


def _slices(n: int, step: int) -> Iterator[slice]:
    return (slice(start, min(start + step, n)) for start in range(0, n, step))


def _joint_slices(
    raws: list[_Raw], n: int, width: type[np.signedinteger[Any]], step: int
) -> Iterator[tuple[slice, np.ndarray]]:
    """Each slice of the records with its records' joint codes over the keys' value codes (0:
    the first key is missing ...). The codes are made afresh for every pass, in one buffer
    reused from slice to slice: cheaper than keeping a record-sized array of them."""
    buffer = np.empty(min(step, n), dtype=width)
    for part in _slices(n, step):
        out = buffer[: part.stop - part.start]
        np.add(raws[0].codes[part], 1, out=out, dtype=width)
        for r in raws[1:]:
            out *= r.size + 1
            out += r.codes[part]
            out += 1
        yield part, out


def _product(key_levels: list[list[Label]]) -> list[list[Label]]:
    labels: list[list[Label]] = [[]]
    for lv in key_levels:
        labels = [[*lab, x] for lab in labels for x in lv]
    return labels


def _check_size(
    raws: list[_Raw], key_levels: list[list[Label]], n_row_keys: int, max_cells: int
) -> None:
    """Refuse a table of more than `max_cells` cells before anything is allocated for it."""
    sides = []
    for side, part in (("rows", slice(0, n_row_keys)), ("cols", slice(n_row_keys, None))):
        names = [r.name for r in raws[part]]
        sides.append((side, names, math.prod(max(len(lv), 1) for lv in key_levels[part])))
    table = math.prod(len(lv) for lv in key_levels)
    for side, names, size in [*sides, ("table", [r.name for r in raws], table)]:
        if size > max_cells:
            raise TooManyCells(
                side,
                names,
                size,
                f"the table would have {max(table, size):,} cells (more than {max_cells:,}); "
                "use fewer or coarser variables",
            )


def _joint_cells(
    raws: list[_Raw],
    finished: list[tuple[np.ndarray, list[Label]]],
    n_row_keys: int,
    nc: int,
) -> np.ndarray:
    """Body cell (-1: none) of every joint code, as `_combine` would place its records."""
    shape = [r.size + 1 for r in raws]
    out = []
    for part in (range(n_row_keys), range(n_row_keys, len(raws))):
        code = np.zeros(shape, dtype=np.int64)
        bad = np.zeros(shape, dtype=bool)
        for i in part:
            table, lv = finished[i]
            ext = np.concatenate(([-1], table)).reshape(
                [-1 if a == i else 1 for a in range(len(shape))]
            )
            code = code * max(len(lv), 1) + np.maximum(ext, 0)
            bad = bad | (ext < 0)
        out.append((code, bad))
    (rc, rbad), (cc, cbad) = out
    return np.where(rbad | cbad, -1, rc * nc + cc).ravel()


def _both(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    """The conjunction of two masks, None standing for all-true (no array is made for it)."""
    if a is None:
        return b
    return a if b is None else a & b


def _pick(x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    return x if mask is None else x[mask]


def _cells(rcode: np.ndarray | None, ccode: np.ndarray | None, nc: int, n: int) -> np.ndarray:
    """Row-major body cell of each record from its row and column codes."""
    if ccode is None:
        return rcode if rcode is not None else np.zeros(n, dtype=np.int64)
    return ccode if rcode is None else rcode * nc + ccode


def tabulate(
    rows: Sequence[Any],
    cols: Sequence[Any] = (),
    *,
    row_names: Sequence[str] | None = None,
    col_names: Sequence[str] | None = None,
    values: Any = None,
    value_name: str | None = None,
    statistic: Statistic = "count",
    margins: bool = False,
    contributor: Any = None,
    source: Source | None = None,
    levels: Sequence[Sequence[Label] | None] | None = None,
    max_cells: int = 1_000_000,
) -> Tabulated:
    """`build_table` plus each record's body cell; `rows` may be empty (one row labelled []).

    Keys may be given already coded (`Coded`, e.g. histogram bins); those are used as they are.
    """
    keys = [*rows, *cols]
    if not keys:
        raise TabulationError("a table needs at least one variable")
    if levels is not None and len(levels) != len(keys):
        raise TabulationError(
            f"levels must list one entry per row and column variable ({len(keys)}), "
            f"got {len(levels)}"
        )
    raws = [
        _raw_key(k, levels is not None, None if levels is None else levels[i])
        for i, k in enumerate(keys)
    ]
    n = len(raws[0].codes)
    for raw in raws:
        if len(raw.codes) != n:
            raise TabulationError(
                f"all columns must have the same length; got {len(raw.codes)} and {n} records"
            )
    where = _Placed(raws, len(rows), n, max_cells)
    rlabels, clabels = where.row_labels, where.col_labels
    nr, nc = len(rlabels), len(clabels)
    shape = TableShape(
        source=source or ("frequency_table" if statistic == "count" else "magnitude_table"),
        row_vars=list(row_names or [f"row_{i}" for i in range(len(rows))]),
        col_vars=list(col_names or [f"col_{i}" for i in range(len(cols))]),
        row_labels=rlabels,
        col_labels=clabels,
        margins=margins,
        two_way=bool(cols),
        value=value_name,
    )
    lay = shape.layout
    ncells = nr * nc
    if statistic == "count":
        if values is not None:
            raise TabulationError("a count table takes no values; use statistic 'sum' or 'mean'")
        return Tabulated(count_table(shape, where.counts()), where.record_cells)
    if values is None:
        raise TabulationError(f"statistic '{statistic}' needs a column of values")
    v_all = _numeric(values)
    if len(v_all) != n:
        raise TabulationError(f"values have {len(v_all)} records, the keys have {n}")
    cell_all, valid = where.per_record()
    nan = np.isnan(v_all)
    any_nan = bool(nan.any())
    # A record without a value adds nothing to its cell, so it is not counted towards the
    # threshold (as ACRO: aggfunc "count" skips missing values) nor in the query set; the
    # checks see it in `missing`.
    inside = _both(valid, ~nan if any_nan else None)
    cell, v = _pick(cell_all, inside), _pick(v_all, inside)
    lacking = (
        np.bincount(_pick(cell_all, _both(valid, nan)), minlength=ncells)
        if any_nan
        else np.zeros(ncells, dtype=np.int64)
    )
    units = None if contributor is None else _pick(_unit_codes(contributor, n), inside)
    top, contributors = _largest_facts(cell, v, units, lay)
    sums = CellSums(
        counts=np.bincount(cell, minlength=ncells),
        total=_record_sums(cell, v, lay),
        missing=lacking,
        negative=np.bincount(cell[v < 0], minlength=ncells) > 0,
        top=top,
        contributors=contributors,
    )
    spread = None
    if statistic in ("std", "mode"):
        keyed = None if contributor is None else _pick(_own_units(contributor), valid)
        spread = _spread_or_mode(statistic, _pick(cell_all, valid), _pick(v_all, valid), lay, keyed)
    output = magnitude_table(shape, statistic, sums, spread)
    return Tabulated(output=output, record_cells=_masked_cells(cell_all, inside))


def _largest_facts(
    cell: np.ndarray, v: np.ndarray, units: np.ndarray | None, lay: Layout
) -> tuple[np.ndarray, np.ndarray | None]:
    """Largest contributions per cell and margin (of per-unit totals when units are given), and
    the number of distinct units (None without units), both laid out."""
    ncells = lay.nr * lay.nc
    if units is None:
        return lay.largest(_largest(cell, v, ncells)[0]), None
    # Dominance is about contributor units (e.g. firms): sum each unit's records first, per
    # cell and again per margin (a unit may lie in several cells of a row).
    pg, ps = _unit_sums(cell, v, units)
    tops, _ = _largest(pg, ps, ncells)
    contributors = np.bincount(pg, minlength=ncells)
    if not lay.margins:
        return lay.grid(tops), lay.grid(contributors)
    margin: list[tuple[np.ndarray, np.ndarray]] = []
    for group, size in (
        (cell // lay.nc, lay.nr),
        (cell % lay.nc, lay.nc),
        (np.zeros(len(cell), dtype=np.int64), 1),
    ):
        g, s = _unit_sums(group, v, units)
        margin.append((_largest(g, s, size)[0], np.bincount(g, minlength=size)))
    (rt, ru), (ct, cu), (gt, gu) = margin
    return lay.grid(tops, rt, ct, gt[0]), lay.grid(contributors, ru, cu, gu[0])


def build_table(
    rows: Sequence[Any],
    cols: Sequence[Any] = (),
    *,
    row_names: Sequence[str] | None = None,
    col_names: Sequence[str] | None = None,
    values: Any = None,
    value_name: str | None = None,
    statistic: Statistic = "count",
    margins: bool = False,
    contributor: Any = None,
    source: Source | None = None,
    query_set: bool = False,
    levels: Sequence[Sequence[Label] | None] | None = None,
    max_cells: int = 1_000_000,
) -> TableOutput:
    """Tabulate `rows` x `cols` (lists of equal-length arrays) into a checked-ready TableOutput.

    `statistic` "count" needs no values; "sum", "mean", "std" and "mode" aggregate `values`
    (records with a missing value are in no cell and counted in `facts.cells.missing`; std and
    mode as `facts.cell_spread_and_mode` computes them). `contributor` (e.g. an employer id)
    makes the threshold count distinct units and the top contributions per-unit totals; a record
    whose unit is unknown is a unit of its own. `levels` (one entry per row then column
    variable: its declared levels, or None) switches to the server's level rule (see the module
    docstring). With `query_set` the facts carry, per record, the index of its body cell (-1 when
    it is in no cell). Tables of more than `max_cells` cells are refused before any memory is
    allocated for them.
    """
    if not rows:
        raise TabulationError("a table needs at least one row variable")
    done = tabulate(
        rows,
        cols,
        row_names=row_names,
        col_names=col_names,
        values=values,
        value_name=value_name,
        statistic=statistic,
        margins=margins,
        contributor=contributor,
        source=source,
        levels=levels,
        max_cells=max_cells,
    )
    out = done.output
    if query_set:
        nr = len(out.row_labels) - (1 if margins else 0)
        nc = len(out.col_labels) - (1 if margins and cols else 0)
        names = [_flat_name(r, c) for r in out.row_labels[:nr] for c in out.col_labels[:nc]]
        out.facts.query_set = QuerySet.from_array(names, done.record_cells().astype(np.int32))
    return out


def _spread_or_mode(
    statistic: str,
    cell: np.ndarray,
    v: np.ndarray,
    lay: Layout,
    contributor: Any,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Value grid and facts of a std or mode table; margins are computed from the records
    (neither statistic adds up from its cells)."""
    nr, nc, width, height = lay.nr, lay.nc, lay.width, lay.height
    r, c = cell // nc, cell % nc
    places = [r * width + c]
    if lay.margins:
        if lay.two_way:
            places.append(r * width + nc)
        places.append(nr * width + c)
        if lay.two_way:
            places.append(np.full(len(cell), nr * width + nc))
    units = None if contributor is None else np.concatenate([contributor] * len(places))
    stat, facts = cell_spread_and_mode(
        statistic, np.concatenate(places), np.concatenate([v] * len(places)), height * width, units
    )
    grid = stat.reshape(height, width)
    return grid, {
        k: [seq[i * width : (i + 1) * width] for i in range(height)] for k, seq in facts.items()
    }


def _flat_name(r: list[Label], c: list[Label]) -> str:
    return ", ".join(str(x) for x in [*r, *c])


def group_cells(
    keys: Sequence[Any],
    levels: Sequence[Sequence[Label] | None],
    n: int,
    *,
    max_cells: int = 1_000_000,
) -> tuple[list[list[Label]], list[list[Label]], np.ndarray]:
    """Group `n` records by the level combinations of `keys` (row-major, the server's level rule
    with `levels` declared per key), as a one-way table of `keys` would place them.

    Returns each key's levels, the label of every group and, per record, its group (-1: a key
    is missing). No key gives one group labelled [] holding every record. More than `max_cells`
    groups raise `TooManyCells` (side "rows") before anything is allocated for them.
    """
    if len(levels) != len(keys):
        raise TabulationError(f"levels must list one entry per key ({len(keys)})")
    if not keys:
        return [], [[]], np.zeros(n, dtype=np.int64)
    raws = [_raw_key(k, True, lv) for k, lv in zip(keys, levels, strict=True)]
    for raw in raws:
        if len(raw.codes) != n:
            raise TabulationError(
                f"all columns must have the same length; got {len(raw.codes)} and {n} records"
            )
    placed = _Placed(raws, len(raws), n, max_cells)
    key_levels = placed.key_levels
    return key_levels, placed.row_labels, placed.record_cells().astype(np.int64, copy=False)
