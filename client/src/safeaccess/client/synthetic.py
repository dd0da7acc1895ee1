"""The workload of a `synthetic_data` analysis, derived from the analysis and the metadata only.

Which columns are synthesised with which codes (declared levels, or bins of a bounded numeric
column, or calendar bins of a date column with declared date_bounds, plus a null code when the
column is nullable), which marginal tables the sandbox computes exactly and which cliques are
measured. Every refusal here depends only on the analysis and the metadata, so it is named
precisely (too many cells, model too large, no bounds, ...).

Shared by the client's validation, the sandbox (coding the records) and the server (noise and
accounting), so that the three agree on every table's shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date
from itertools import combinations

from safeaccess.client.analyses import SyntheticData
from safeaccess.client.dateparts import part_starts
from safeaccess.client.dpquery import Label, declared_levels
from safeaccess.client.metadata import Column, DatasetMetadata

#: Equal-width bins of a numeric column that declares no `synth_bins` and gets none in `bins`.
DEFAULT_BINS = 10
MAX_TARGETS = 10
#: Most default bins of a date column: whole months, else whole years, else blocks of years.
MAX_DATE_BINS = 24
#: The day number of 1970-01-01: a date is coded as its proleptic Gregorian ordinal
#: (`date.toordinal()`), numpy's datetime64[D] counts days from here.
EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


class SynthInvalid(ValueError):
    """The analysis cannot be synthesised on this metadata; `problems` are (field, message)."""

    def __init__(self, problems: list[tuple[str, str]]):
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))
        self.problems = problems


@dataclass(frozen=True)
class SynthColumn:
    """One synthesised column: its codes are 0..size-1 (levels or bins, then null if nullable)."""

    name: str
    type: str
    levels: tuple[Label, ...] | None
    edges: tuple[float, ...] | None
    nullable: bool
    bounds: tuple[float, float] | None

    @property
    def values(self) -> int:
        """Codes that stand for a value (levels or bins), without the null code."""
        if self.levels is not None:
            return len(self.levels)
        assert self.edges is not None
        return len(self.edges) - 1

    @property
    def size(self) -> int:
        return self.values + (1 if self.nullable else 0)

    @property
    def null_code(self) -> int | None:
        return self.values if self.nullable else None


@dataclass(frozen=True)
class SynthWorkload:
    """Columns, the exact tables the sandbox returns, and the cliques that are measured."""

    method: str
    columns: tuple[SynthColumn, ...]
    pairs: tuple[tuple[int, int], ...]  # mst: every pair, scored for the tree; fixed: none
    cliques: tuple[tuple[int, ...], ...]  # fixed: the listed cliques; mst: extra ones
    keys: tuple[int, ...]
    targets: tuple[int, ...]

    def cells(self, clique: tuple[int, ...]) -> int:
        return math.prod(self.columns[i].size for i in clique)

    @property
    def tables(self) -> tuple[tuple[int, ...], ...]:
        """The exact tables the sandbox returns, in this order: one-ways, pairs, cliques."""
        ones = tuple((i,) for i in range(len(self.columns)))
        return ones + self.pairs + self.cliques

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


def _edges(col: Column, given: list[float] | None) -> tuple[tuple[float, ...] | None, str | None]:
    """Bin edges of a bounded numeric column, or (None, why not)."""
    if col.bounds is None:
        return None, (
            f"column {col.name!r} is {col.type} without declared bounds: synthetic data needs "
            "bounds to bin it"
        )
    lo, hi = col.bounds
    if given is not None:
        if given[0] < lo or given[-1] > hi:
            return None, (
                f"bins of {col.name!r} must lie inside its bounds [{lo:g}, {hi:g}], got "
                f"[{given[0]:g}, {given[-1]:g}]"
            )
        return tuple(float(e) for e in given), None
    if col.synth_bins is not None:
        return tuple(float(e) for e in col.synth_bins), None
    if hi <= lo:
        return None, f"column {col.name!r} has bounds of no width; it cannot be binned"
    if col.type == "integer":
        edges = sorted({round(lo + (hi - lo) * i / DEFAULT_BINS) for i in range(DEFAULT_BINS + 1)})
        return tuple(float(e) for e in edges), None
    return tuple(lo + (hi - lo) * i / DEFAULT_BINS for i in range(DEFAULT_BINS + 1)), None


def date_edges(first: date, last: date) -> tuple[float, ...]:
    """Default bin edges of a date column with date_bounds (first, last), as day numbers
    (ordinals): calendar months when the bounds touch at most MAX_DATE_BINS months, else
    calendar years, else blocks of k years starting on years divisible by k (the smallest k
    that makes at most MAX_DATE_BINS bins). Bins are
    [edge, next edge) and the last one holds `last`, as the numeric bins are; calendar bins keep
    a year or month of the synthetic records inside one bin, so `year(col)` and `month(col)`
    tables on them count what the model measured instead of bins straddling a New Year."""
    months = (last.year - first.year) * 12 + last.month - first.month + 1
    if months <= MAX_DATE_BINS:
        inner = [d for d in part_starts("month", first, last) if d < last]
    else:
        years = [d for d in part_starts("year", first, last) if d < last]
        step = math.ceil((last.year - first.year + 1) / MAX_DATE_BINS)
        # aligned blocks may leave a partial one at each end: the smallest step that fits
        while len(inner := [d for d in years if d.year % step == 0]) >= MAX_DATE_BINS:
            step += 1
    days = [first.toordinal(), *(d.toordinal() for d in inner), last.toordinal()]
    return tuple(float(d) for d in days)


def _date_column(col: Column, field: str, problems: list[tuple[str, str]]) -> SynthColumn | None:
    """A date column coded as a bounded integer column on its day number, in calendar bins."""
    if col.date_bounds is None:
        problems.append(
            (
                field,
                f"column {col.name!r} is a date without declared date_bounds: synthetic data "
                "needs them to bin it (date_bounds: ['YYYY-MM-DD', 'YYYY-MM-DD'])",
            )
        )
        return None
    first, last = col.date_bounds
    if first == last:
        problems.append((field, f"column {col.name!r} has date_bounds of one day; leave it out"))
        return None
    edges = date_edges(first, last)
    bounds = (float(first.toordinal()), float(last.toordinal()))
    return SynthColumn(col.name, col.type, None, edges, col.nullable, bounds)


def _column(
    col: Column, bins: dict[str, list[float]], problems: list[tuple[str, str]], field: str
) -> SynthColumn | None:
    if col.type == "identifier":
        problems.append((field, f"column {col.name!r} is an identifier and is never synthesised"))
        return None
    if col.type == "text":
        problems.append((field, f"column {col.name!r} is free text and is never synthesised"))
        return None
    if col.contributor:
        problems.append(
            (field, f"column {col.name!r} is the contributor column and is never synthesised")
        )
        return None
    numeric = col.type in ("integer", "continuous")
    if col.type == "date":
        if col.name in bins:
            problems.append(
                (
                    f"bins.{col.name}",
                    f"column {col.name!r} is a date; it is binned by calendar months or years "
                    "from its date_bounds, give it no bins",
                )
            )
            return None
        return _date_column(col, field, problems)
    if col.name in bins and not numeric:
        problems.append(
            (f"bins.{col.name}", f"column {col.name!r} is {col.type}; only numeric columns bin")
        )
        return None
    levels = declared_levels(col) if col.type != "continuous" else None
    if levels is not None and col.name not in bins:
        return SynthColumn(col.name, col.type, tuple(levels), None, col.nullable, col.bounds)
    if not numeric:
        problems.append(
            (
                field,
                f"column {col.name!r} declares no levels; synthetic data codes only declared levels",
            )
        )
        return None
    edges, why = _edges(col, bins.get(col.name))
    if edges is None:
        problems.append((f"bins.{col.name}" if col.name in bins else field, str(why)))
        return None
    return SynthColumn(col.name, col.type, None, edges, col.nullable, col.bounds)


def synth_workload(
    analysis: SyntheticData,
    metadata: DatasetMetadata,
    *,
    max_cells: int = 100_000,
    max_model_cells: int = 10_000_000,
    max_rows: int = 1_000_000,
) -> SynthWorkload:
    """The workload of `analysis` on `metadata`; raises `SynthInvalid` naming every problem."""
    problems: list[tuple[str, str]] = []
    columns: list[SynthColumn] = []
    index: dict[str, int] = {}
    for i, name in enumerate(analysis.columns):
        col = metadata.column(name)
        if col is None:
            problems.append((f"columns[{i}]", f"unknown column {name!r} in {metadata.name!r}"))
            continue
        sc = _column(col, analysis.bins, problems, f"columns[{i}]")
        if sc is not None:
            index[name] = len(columns)
            columns.append(sc)
    for name in analysis.bins:
        if name not in analysis.columns:
            problems.append((f"bins.{name}", f"{name!r} is not one of the synthesised columns"))
    cliques: list[tuple[int, ...]] = []
    for i, listed in enumerate(analysis.marginals):
        missing = [c for c in listed if c not in analysis.columns]
        if missing:
            problems.append(
                (f"marginals[{i}]", f"{', '.join(missing)} not among the synthesised columns")
            )
        elif all(c in index for c in listed):
            cliques.append(tuple(index[c] for c in listed))
    if analysis.rows is not None and analysis.rows > max_rows:
        problems.append(("rows", f"{analysis.rows} rows asked; the centre allows {max_rows}"))
    roles: dict[str, list[int]] = {"keys": [], "targets": []}
    for field, names in (("keys", analysis.keys), ("targets", analysis.targets)):
        for j, name in enumerate(names):
            if name not in index:
                problems.append(
                    (f"{field}[{j}]", f"{name!r} is not one of the synthesised columns")
                )
            else:
                roles[field].append(index[name])
    if problems:
        raise SynthInvalid(problems)
    d = len(columns)
    pairs = tuple(combinations(range(d), 2)) if analysis.method == "mst" else ()
    work = SynthWorkload(analysis.method, tuple(columns), pairs, tuple(cliques), (), ())
    for clique in work.tables:
        cells = work.cells(clique)
        if cells > max_cells:
            label = ", ".join(columns[i].name for i in clique)
            problems.append(
                (
                    "marginals" if len(clique) != 2 or analysis.method != "mst" else "columns",
                    f"too many cells: the table of ({label}) has {cells} cells; the centre "
                    f"allows {max_cells} per table (coarser bins or fewer levels)",
                )
            )
    pair_cells = sorted((work.cells(p) for p in pairs), reverse=True)
    model = sum(work.cells((i,)) for i in range(d)) + sum(pair_cells[: d - 1])
    model += sum(work.cells(c) for c in cliques)
    if model > max_model_cells:
        problems.append(
            (
                "marginals",
                f"model too large: its cliques have {model} cells in all; the centre allows "
                f"{max_model_cells}",
            )
        )
    exact = sum(work.cells(t) for t in work.tables)
    if exact > max_model_cells:
        problems.append(
            (
                "columns",
                f"model too large: the exact tables to measure have {exact} cells in all; the "
                f"centre allows {max_model_cells} (fewer columns or coarser bins)",
            )
        )
    if problems:
        raise SynthInvalid(problems)
    keys = _declared(metadata, columns, "quasi_identifier") + roles["keys"]
    targets = _declared(metadata, columns, "sensitive") + roles["targets"]
    if not keys:
        keys = list(range(d))
    if not targets:
        # The default targets leave out a column that is the only key: the attribute-inference
        # check attacks each target from the other keys, and there would be none.
        targets = [t for t in range(min(d, MAX_TARGETS)) if any(k != t for k in keys)]
    lonely = [columns[t].name for t in dict.fromkeys(targets) if all(k == t for k in keys)]
    if lonely:
        raise SynthInvalid(
            [
                (
                    "keys",
                    f"{lonely[0]!r} is a target and the only key column: the disclosure check "
                    "attacks each target from the other key columns, so name at least one "
                    "more key (keys=[...])",
                )
            ]
        )
    return SynthWorkload(
        analysis.method,
        tuple(columns),
        pairs,
        tuple(cliques),
        tuple(dict.fromkeys(keys)),
        tuple(dict.fromkeys(targets)),
    )


def _declared(metadata: DatasetMetadata, columns: list[SynthColumn], flag: str) -> list[int]:
    out = []
    for i, sc in enumerate(columns):
        col = metadata.column(sc.name)
        if col is not None and getattr(col, flag):
            out.append(i)
    return out
