"""Refusals that are not oracles: a repeated query set must be repeated by definition.

When the records make a new query set a combination of released ones (`Admission.dependencies`:
e.g. the probe `age < 90 or (age >= 96 and income > X)` holds the same records as the released
`age < 90`), the auditor has learnt a zero: no record lies in the difference. If the outputs'
definitions imply it (a table's margin is the sum of its cells, a repeated table repeats), the
zero is structural and tells nothing. If only the records imply it, releasing the probe while
refusing its other branch (the difference holds one person: too small) makes the refusal an
oracle on a confidential value, and a binary search recovers it. So a data-revealed zero is
treated like a small difference and refused: both branches of such a probe are refused.

The two are told apart from the metadata alone, on a domain grid: every declared level of the
categorical columns the outputs name, and for numeric columns the constants the outputs use with
their neighbours, the points between them and the declared bounds (every integer when an integer
column's bounds span few); a continuous column's constants inside its bounds are points of their
own, and a column tested with `is null` gets a missing value (an exact value is a place one
person can be: without its point, the "no" branch of `C or (age >= 96 and income in (...))` was
a repeat on the grid, released while the "yes" branch was refused). Each output's analysis is run on the grid frame with the runner's own
compute code (nothing there is confidential: the frame is built from metadata), each row is found
by its cell label, and the dependency's coefficients (exact mod the lane's prime) are applied: a
combination that is zero on the grid is structural; one that is not is a data-revealed zero.

When a row cannot be evaluated on the grid (its cell is defined by the data, like a model's
leaves; the grid would exceed `GRID_CAP` points; an older state without definitions), the
decision falls back to the outputs' filters alone: the dependency is allowed only when every
output in it selects the same records on the grid (the dependency then lies inside one
population's own cells), and refused otherwise.
"""

from __future__ import annotations

import functools
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from itertools import pairwise, product
from types import EllipsisType
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt
import pandas as pd
from pydantic import BaseModel, ConfigDict

from safeaccess.client.dateparts import parse_part, part_starts
from safeaccess.client.grammar.filters import (
    Between,
    Compare,
    Filter,
    In,
    IsNull,
    Not,
    parse_filter,
)
from safeaccess.client.grammar.formulas import formula_columns, parse_formula
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.validation import is_iso_date
from safeaccess.rules.outputs import Output, extra_query_sets_of, query_set_of
from safeaccess.rules.qss import Admission
from safeaccess.sandbox.backend import RunnerRequest
from safeaccess.sandbox.runner import run_request
from safeaccess.sandbox.runner.filters import row_mask
from safeaccess.server.digests import sha256_hex

#: Most points a grid may have; above it the check falls back to the filters alone.
GRID_CAP = 200_000
#: Kinds whose cells the records define (a model's leaves): never re-run on a grid.
DATA_DEFINED_KINDS = frozenset({"model_training"})
#: An integer column whose bounds span at most this many values gets every one of them.
ALL_INTEGERS = 128

BoolArray = npt.NDArray[np.bool_]


class Origin(BaseModel):
    """What one admission's rows are: its analysis (None: a dataset version's population) and
    the (query-set array, cell label) of each row it added, in row order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    analysis: dict[str, Any] | None
    rows: list[tuple[int, str]]


def output_labels(output: Output | None) -> list[list[str]]:
    """The cell labels of each query-set array of `output` (main first, then the extras), then
    the row labels of each weighted set (numbered after the arrays, as `admit` numbers them)."""
    if output is None:
        return []
    qs = query_set_of(output)
    if qs is None:
        return []
    extras = extra_query_sets_of(output)
    return (
        [qs.labels]
        + [q.labels for q in extras if not q.weighted]
        + [list(q.row_labels or []) for q in extras if q.weighted]
    )


def _label(labels: Sequence[Sequence[str]], array: int, cell: int) -> str:
    names = labels[array] if array < len(labels) else []
    return names[cell] if cell < len(names) else f"#{cell}"


def origin_of(
    analysis: dict[str, Any] | None, labels: Sequence[Sequence[str]], admission: Admission
) -> Origin:
    """The definitions of the rows `admission` added (cell labels from `output_labels`)."""
    rows = [(array, _label(labels, array, cell)) for array, cell in admission.kept_keys]
    return Origin(analysis=analysis, rows=rows)


@dataclass(frozen=True)
class Revealed:
    """A data-revealed zero: why (for checkers) and the earlier admissions it involves."""

    reason: str
    conflicts_with: list[int]


class _Source(NamedTuple):
    # A tuple: a step checks a few dozen dependencies of several rows each, and a frozen
    # dataclass costs several times a tuple to make.
    origin: int
    array: int
    label: str


def data_revealed(
    admission: Admission,
    current: Origin,
    labels: Sequence[Sequence[str]],
    origins: Mapping[int, Origin],
    metadata: DatasetMetadata,
) -> Revealed | None:
    """None when every dependency of `admission` holds by the outputs' definitions; else the
    first that only the records imply (its reason, for checkers, and the admissions in it). `current` is
    `origin_of(...)` for this admission, `labels` its output's cell labels, `origins` the
    definitions of every earlier admission of the scope."""
    if not admission.dependencies or admission.state is None:
        return None
    constraints = admission.state.constraints
    if constraints is None:
        return None
    row_origin = constraints.origin.astype(np.int64)
    this = int(admission.facts.get("origin", -1))
    known: dict[int, Origin] = {**origins, this: current}

    starts: dict[int, int] = {}  # each origin's first row: a step's dependencies share a few
    sources: dict[int, _Source | None] = {}  # by row: a step's dependencies share many

    def source(row: int) -> _Source | None:
        found = sources.get(row, ...)
        if found is not ...:
            return found
        o = int(row_origin[row])
        entry = known.get(o)
        if o < 0 or entry is None:
            return sources.setdefault(row, None)
        start = starts.get(o)
        if start is None:
            start = starts[o] = int(np.searchsorted(row_origin, o, side="left"))
        index = row - start
        if not 0 <= index < len(entry.rows):
            return sources.setdefault(row, None)
        array, label = entry.rows[index]
        return sources.setdefault(row, _Source(o, array, label))

    evaluator = _GridEvaluator(metadata, known)
    for dep in admission.dependencies:
        array, cell = dep.key
        involved: list[_Source | None] = [_Source(this, array, _label(labels, array, cell))]
        involved += [source(r) for r in dep.rows.tolist()]
        if not evaluator.holds(involved, dep.coefficients.tolist(), dep.p):
            named = sorted({s.origin for s in involved if s is not None} - {this})
            reason = (
                "the records make this output's query set a combination of earlier releases "
                f"(admissions {named}) that the outputs' definitions do not imply: a zero "
                "revealed by the data, refused like a small difference so that the refusal "
                "is no oracle"
            )
            return Revealed(reason=reason, conflicts_with=named)
    return None


Rows = dict[tuple[int, str], BoolArray]
#: One grid: its column names and its axes' points written out (`repr`: exact, and 1, 1.0 and
#: True written apart, since they are equal keys but not equal points).
GridId = tuple[tuple[str, ...], str]
#: What defines a grid frame across steps: the metadata (as JSON) and the grid.
GridKey = tuple[str, GridId]


class _EvaluatedRows:
    """An analysis's rows on a grid, kept across steps (bounded; thread-safe).

    A grid frame is a function of the metadata, its column names and its axis points, all
    public, and `run_request` never modifies its input, so the rows an analysis gives on it are
    a function of that key and the analysis: the next step that meets the same admissions on
    the same grid (a repeated table meets every earlier one) reads them instead of running
    the analysis on the grid again. Only small grids are kept, within a byte budget; the
    arrays are made read-only."""

    def __init__(self, max_points: int = 4096, max_bytes: int = 32 * 1024 * 1024):
        self.max_points = max_points
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[GridKey, str], tuple[Rows | None, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[GridKey, str]) -> Rows | EllipsisType | None:
        """The rows kept for `key` (None: the analysis has no rows there), else `...`."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return ...
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: tuple[GridKey, str], rows: Rows | None) -> None:
        """Keep `rows` for `key`, dropping the least recently used past the budget."""
        size = 0 if rows is None else sum(a.nbytes for a in rows.values())
        if size > self.max_bytes:
            return
        for array in (rows or {}).values():
            array.flags.writeable = False
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = (rows, size)
            self._bytes += size
            while self._bytes > self.max_bytes or len(self._entries) > 4096:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped


_EVALUATED = _EvaluatedRows()

#: A dependency by the outputs' definitions (`_GridEvaluator._combination`).
Combination = tuple[tuple[tuple[str, int, str], int], ...]


class _Verdicts:
    """`holds` verdicts kept across steps by (metadata, prime, combination): bounded, least
    recently used first out; thread-safe."""

    def __init__(self, max_entries: int = 4096):
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, int, Combination], bool] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int, Combination]) -> bool | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: tuple[str, int, Combination], verdict: bool) -> None:
        with self._lock:
            self._entries[key] = verdict
            if len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


_VERDICTS = _Verdicts()


class _GridEvaluator:
    """Rows evaluated on domain grids, cached per set of columns and per admission (and, for
    small grids, across steps: `_EvaluatedRows`)."""

    def __init__(self, metadata: DatasetMetadata, origins: Mapping[int, Origin]):
        self.metadata = metadata
        self.columns = {c.name: c for c in metadata.columns}
        self.origins = origins
        self._rows: dict[tuple[GridId, int], Rows | None] = {}
        self._frames: dict[GridId, pd.DataFrame] = {}
        # The grid of each set of columns cut at the constants of a set of admissions (None:
        # over GRID_CAP points), and the axes of each grid.
        self._grids: dict[tuple[tuple[str, ...], tuple[int, ...]], GridId | None] = {}
        self._axes: dict[GridId, list[list[Any]]] = {}
        self._metadata_key: str | None = None
        # By admission number: an admission's analysis never changes, and a step checks many
        # dependencies over the same few admissions (parsing their filters each time was most
        # of this check's cost).
        self._names: dict[int, set[str]] = {}
        # The grid's columns for each set of admissions a dependency involves.
        self._names_of: dict[tuple[int, ...], tuple[str, ...]] = {}
        self._texts: dict[int, str | None] = {}

    def holds(self, involved: Sequence[_Source | None], coefficients: list[int], p: int) -> bool:
        """Whether new − Σ coefficients · rows is zero on the grid (mod p); `involved[0]` is
        the new row, the rest pair with `coefficients`."""
        if None in involved:
            return False  # a row of unknown definition: nothing can show the zero structural
        sources = cast(Sequence[_Source], involved)
        combination = self._combination(sources, coefficients, p)
        if combination is None:
            return self._on_grid(sources, coefficients, p)
        defined, weights = combination
        if defined and not any(weight for _, weight in weights):
            return True
        key = (self._metadata_digest(), p, weights)
        verdict = _VERDICTS.get(key)
        if verdict is None:
            verdict = self._on_grid(sources, coefficients, p)
            _VERDICTS.put(key, verdict)
        return verdict

    def _combination(
        self, sources: Sequence[_Source], coefficients: list[int], p: int
    ) -> tuple[bool, Combination] | None:
        """The dependency by the outputs' definitions: each distinct (analysis as text, array,
        cell) with its summed weight mod p, sorted; and whether every row is an analysis's.
        None when a row's analysis is not writable as JSON.

        Rows of one analysis, array and cell are one query set on any data, so when every
        weight is zero (a repeated table's cell against the same cell released before) the
        dependency holds by definition, on every grid, a grid over the cap included. A
        population (text "null") is never matched so: two of them may be different versions'
        records. On the grid, though, every population's rows are all its points, and whether
        a combination holds there is a function of the combination and the metadata alone (the
        grid is cut at the constants of its analyses, each row is an analysis's row on it): so
        its verdict is kept across steps (`_VERDICTS`), as a repeated table meets the same
        combinations at each step."""
        weights: dict[tuple[str, int, str], int] = {}
        defined = True
        for weight, (origin, array, label) in zip(
            (1, *(-c for c in coefficients)), sources, strict=True
        ):
            text = self._text(origin)
            if text is None:
                return None
            defined = defined and self.origins[origin].analysis is not None
            key = (text, array, label)
            weights[key] = (weights.get(key, 0) + weight) % p
        return defined, tuple(sorted(weights.items()))

    def _on_grid(self, sources: Sequence[_Source], coefficients: list[int], p: int) -> bool:
        """`holds`, decided on the grid of the involved analyses (or by their filters)."""
        origins = tuple(sorted({s.origin for s in sources}))
        names = self._names_of.get(origins)
        if names is None:
            names = tuple(sorted(set().union(*(self._origin_names(o) for o in origins))))
            self._names_of[origins] = names
        grid = self._grid(names, origins)
        vectors = None if grid is None else [self._row(grid, s) for s in sources]
        if vectors is None or any(v is None for v in vectors):
            return self._same_filters(sources)
        # Σ weight · row, with the weights of one array summed first (mod p): rows read from
        # one evaluation are one object (a repeated table's row and the earlier one it repeats,
        # through `_EVALUATED`), and their weights usually cancel, which leaves nothing to add.
        weights: dict[int, int] = {}
        arrays: dict[int, BoolArray] = {}
        for weight, vec in zip((1, *(-c for c in coefficients)), vectors, strict=True):
            assert vec is not None
            arrays[id(vec)] = vec
            weights[id(vec)] = (weights.get(id(vec), 0) + weight) % p
        live = [(w, arrays[k]) for k, w in weights.items() if w]
        if not live:
            return True
        total = np.zeros(len(live[0][1]), dtype=np.int64)
        for weight, vec in live:
            total = (total + weight * np.asarray(vec, dtype=np.int64)) % p
        return not bool(np.any(total))

    def _metadata_digest(self) -> str:
        """The SHA-256 of the metadata as JSON: part of the keys of what is kept across steps
        (its digest, not the text, which each step makes anew and each entry would keep)."""
        if self._metadata_key is None:
            self._metadata_key = sha256_hex(self.metadata.model_dump_json().encode())
        return self._metadata_key

    def _text(self, origin: int) -> str | None:
        """Admission `origin`'s analysis as canonical text ("null" for a population; None when
        it is not writable as JSON), computed once per evaluator: equal text, equal analysis."""
        if origin not in self._texts:
            try:
                # Sorted keys, and 1, 1.0 and true written apart.
                text: str | None = json.dumps(
                    self.origins[origin].analysis, sort_keys=True, allow_nan=False
                )
            except (TypeError, ValueError):
                text = None
            self._texts[origin] = text
        return self._texts[origin]

    def _same_filters(self, sources: Sequence[_Source]) -> bool:
        """The fallback: every involved output selects the same records on the filters' grid."""
        wheres = [_where(self.origins[s.origin].analysis) for s in sources]
        names = tuple(sorted(set().union(*(_filter_names(w) for w in wheres))))
        grid = self._grid(names, tuple(sorted({s.origin for s in sources})))
        if grid is None:
            return False
        frame = self._frame(grid)
        masks = []
        for where in wheres:
            try:
                masks.append(row_mask(frame, where))
            except Exception:
                return False
        return all(np.array_equal(masks[0], m) for m in masks[1:])

    def _origin_names(self, origin: int) -> set[str]:
        """The columns admission `origin`'s analysis names (computed once per evaluator)."""
        names = self._names.get(origin)
        if names is None:
            names = self._names[origin] = self._named(self.origins[origin].analysis)
        return names

    def _named(self, analysis: dict[str, Any] | None) -> set[str]:
        if analysis is None:
            return set()
        found: set[str] = set()
        for text in _strings(analysis):
            if text in self.columns:
                found.add(text)
                continue
            part = parse_part(text) if "(" in text else None
            if part is not None:  # `year(admitted)` groups by `admitted`
                found.add(part[1])
                continue
            found |= _filter_names(text) | _formula_names(text)
        # a filter's `year(admitted)` compares `admitted`
        found |= {p[1] for n in found if "(" in n and (p := parse_part(n)) is not None}
        return found & set(self.columns)

    def _grid(self, names: tuple[str, ...], origins: tuple[int, ...]) -> GridId | None:
        """The grid of `names` cut at the constants of admissions `origins` (every one of
        them, so a dependency is judged on points that tell its own rows apart, whichever
        dependency of the step came first), or None when it would exceed `GRID_CAP` points.
        The frame itself is built only when an analysis must run on it (`_frame`): a step
        whose rows another step evaluated on the same grid reads them by key."""
        key = (names, origins)
        if key not in self._grids:
            # each distinct analysis once (a repeated table's admissions share one)
            distinct = {self._text(o) or f"#{o}": self.origins[o].analysis for o in origins}
            analyses = list(distinct.values())
            constants = _constants(analyses)
            numbers = _numbers(analyses)
            nulls = _null_columns(analyses)
            parts = _date_parts(analyses)
            axes = [
                _points(self.columns[n], constants.get(n, set()), numbers, parts.get(n, set()))
                + _null(n in nulls)
                for n in names
            ]
            size = math.prod(len(a) for a in axes) if axes else 1
            grid: GridId | None = None
            if size <= GRID_CAP:
                grid = (names, repr(axes))
                self._axes.setdefault(grid, axes)
            self._grids[key] = grid
        return self._grids[key]

    def _frame(self, grid: GridId) -> pd.DataFrame:
        """The frame of `grid`: one record per point, every other column a filler."""
        frame = self._frames.get(grid)
        if frame is None:
            names, axes = grid[0], self._axes[grid]
            data: dict[str, Any] = {}
            combos = list(product(*axes)) if axes else [()]
            for i, name in enumerate(names):
                data[name] = [combo[i] for combo in combos]
            for col in self.metadata.columns:
                if col.name not in data:
                    data[col.name] = [_filler(col)] * len(combos)
            frame = pd.DataFrame({c.name: _typed(c, data[c.name]) for c in self.metadata.columns})
            self._frames[grid] = frame
        return frame

    def _row(self, grid: GridId, src: _Source) -> BoolArray | None:
        cached = self._rows.get((grid, src.origin), ...)
        if cached is ...:
            cached = self._evaluated(grid, src.origin)
            self._rows[(grid, src.origin)] = cached
        if cached is None:
            return None
        return cached.get((src.array, src.label))

    def _evaluated(self, grid: GridId, origin: int) -> Rows | None:
        """`_evaluate` of admission `origin`'s analysis on `grid`, read from `_EVALUATED` when
        another step ran it on the same grid (small grids only)."""
        analysis, text = self.origins[origin].analysis, self._text(origin)
        if text is None or math.prod(len(a) for a in self._axes[grid]) > _EVALUATED.max_points:
            return self._evaluate(self._frame(grid), analysis)
        key = ((self._metadata_digest(), grid), text)
        found = _EVALUATED.get(key)
        if found is not ...:
            return found
        rows = self._evaluate(self._frame(grid), analysis)
        _EVALUATED.put(key, rows)
        return rows

    def _evaluate(self, frame: pd.DataFrame, analysis: dict[str, Any] | None) -> Rows | None:
        if analysis is None:  # a population: every record
            return {(0, label): np.ones(len(frame), dtype=bool) for label in ("all", "#0")}
        if analysis.get("kind") in DATA_DEFINED_KINDS:
            return None  # its cells are learnt from the records: no grid can define them
        request = RunnerRequest(
            analysis=analysis, metadata=self.metadata.model_dump(mode="json"), dataset_path="grid"
        )
        try:
            response = run_request(request, frame)
        except Exception:
            return None
        if not response.ok or response.output is None:
            return None
        rows: Rows = {}
        qs = query_set_of(response.output)
        if qs is None:
            return None
        # The partitions only, in `output_labels`' numbering. A weighted row (a fit's design
        # column over value groups, issue 41) is not a set of records: it is never evaluated
        # here as the set its cells cover (which would make it a repeat of the fit's own set),
        # so a dependency it is in holds by definition only as its own repeat, or by the
        # filters' fallback like every row the grid cannot evaluate (`_same_filters`).
        arrays = [qs, *(q for q in extra_query_sets_of(response.output) if not q.weighted)]
        for g, q in enumerate(arrays):
            if not q.attached:
                return None
            cells = q.to_array()
            for c, label in enumerate(q.labels):
                rows[(g, label)] = cells == c
        return rows


def _where(analysis: dict[str, Any] | None) -> str | None:
    if analysis is None:
        return None
    where = analysis.get("where")
    return where if isinstance(where, str) and where.strip() else None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def _numbers(analyses: Sequence[dict[str, Any] | None]) -> set[float]:
    """Every number the analyses use outside their filters (bin edges, cut points...)."""
    found: set[float] = set()

    def walk(value: Any) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, int | float) and math.isfinite(value):
            found.add(float(value))
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)

    for analysis in analyses:
        walk(analysis)
    return found


@functools.lru_cache(maxsize=4096)
def _parsed(text: str | None) -> Filter | None:
    """The parsed filter (None: none, or not one), kept: the same filters are parsed at every
    step of a scope, and a parsed filter is never modified."""
    if text is None:
        return None
    try:
        return parse_filter(text)
    except Exception:
        return None


def _filter_names(text: str | None) -> set[str]:
    node = _parsed(text)
    return set() if node is None else {n for n, _ in _literals(node)} | _columns(node)


def _formula_names(text: str) -> set[str]:
    try:
        return set(formula_columns(parse_formula(text)))
    except Exception:
        return set()


def _columns(node: Filter) -> set[str]:
    if isinstance(node, Compare | In | Between | IsNull):
        return {node.column}
    if isinstance(node, Not):
        return _columns(node.operand)
    return set().union(*(_columns(o) for o in node.operands))


def _literals(node: Filter) -> Iterator[tuple[str, Any]]:
    if isinstance(node, Compare):
        yield node.column, node.value
    elif isinstance(node, In):
        for v in node.values:
            yield node.column, v
    elif isinstance(node, Between):
        yield node.column, node.low
        yield node.column, node.high
    elif isinstance(node, Not):
        yield from _literals(node.operand)
    elif not isinstance(node, IsNull):
        for o in node.operands:
            yield from _literals(o)


def _null_columns(analyses: Sequence[dict[str, Any] | None]) -> set[str]:
    """The columns the analyses' filters test with `is null` / `is not null`."""
    out: set[str] = set()

    def walk(node: Filter) -> None:
        if isinstance(node, IsNull):
            out.add(node.column)
        elif isinstance(node, Not):
            walk(node.operand)
        elif not isinstance(node, Compare | In | Between):
            for o in node.operands:
                walk(o)

    for analysis in analyses:
        for text in _strings(analysis or {}):
            node = _parsed(text)
            if node is not None:
                walk(node)
    return out


def _null(missing: bool) -> list[Any]:
    """The missing value's own point, for a column a filter tests with `is null`: otherwise
    `C or (age >= 96 and income is null)` would equal `C` on the grid, and its "no" branch
    would be released as a repeat while its "yes" branch (one person more) is refused."""
    return [None] if missing else []


def _constants(analyses: Sequence[dict[str, Any] | None]) -> dict[str, set[Any]]:
    """The literal values each column is compared with in the analyses' filters."""
    out: dict[str, set[Any]] = {}
    for analysis in analyses:
        for text in _strings(analysis or {}):
            node = _parsed(text)
            if node is None:
                continue
            for name, value in _literals(node):
                out.setdefault(name, set()).add(value)
    return out


def _date_parts(analyses: Sequence[dict[str, Any] | None]) -> dict[str, set[str]]:
    """The parts ('year', 'month', 'day') each date column is grouped by or compared by in
    the analyses (their levels are the pieces of the calendar the grid must tell apart)."""
    out: dict[str, set[str]] = {}
    for analysis in analyses:
        for text in _strings(analysis or {}):
            names = {text} if "(" in text else set()
            node = _parsed(text) if "(" in text else None
            if node is not None:
                names = _columns(node)
            for name in names:
                part = parse_part(name)
                if part is not None:
                    out.setdefault(part[1], set()).add(part[0])
    return out


def _points(
    col: Column, constants: set[Any], numbers: set[float], parts: Sequence[str] | set[str] = ()
) -> list[Any]:
    """One representative of every piece the constants cut a column's declared domain into
    (and, for a date column grouped by its year, month or day, every piece of the calendar
    each of those levels is: each level is a cell whose records the grid must place)."""
    if col.type in ("categorical", "ordinal"):
        levels: list[Any] = list(col.levels or [])
        extra = [v for v in constants if v not in levels]
        return levels + sorted(extra, key=str) + ([] if extra or levels else ["(any)"])
    if col.type == "identifier":
        numeric = sorted(float(v) for v in constants if isinstance(v, int | float))
        return _numeric_points(numeric, None, integer=True) or [0]
    if col.type == "date":
        # Days are the places records can be: the dates the filters name, their neighbours
        # and the declared first and last dates cut the calendar into pieces, as for integers.
        days = sorted(float(date.fromisoformat(v).toordinal()) for v in constants if is_iso_date(v))
        span = col.date_bounds
        if span is not None:  # parts are validated to need date_bounds (their levels)
            for part in sorted(parts):
                days += [float(d.toordinal()) for d in part_starts(part, *span)]
            days.sort()
        bounds = (float(span[0].toordinal()), float(span[1].toordinal())) if span else None
        points = _numeric_points(days, bounds, integer=True)
        return [date.fromordinal(int(p)).isoformat() for p in points if int(p) >= 1]
    cuts = sorted(
        {float(v) for v in constants if isinstance(v, int | float) and not isinstance(v, bool)}
        | numbers
    )
    bounds = col.bounds or ((float(col.scale[0]), float(col.scale[1])) if col.scale else None)
    integer = col.type == "integer"
    if integer and bounds is not None:
        low, high = math.ceil(bounds[0]), math.floor(bounds[1])
        if high - low + 1 <= ALL_INTEGERS:
            return list(range(low, high + 1))
    return _numeric_points(cuts, bounds, integer=integer)


def _numeric_points(
    cuts: list[float], bounds: tuple[float, float] | None, *, integer: bool
) -> list[Any]:
    """Representatives of the pieces `cuts` and `bounds` make. An integer column gets the
    marks themselves and their neighbours (each integer is a place records can be). A
    continuous one gets the points strictly between marks (and beyond them when unbounded) and
    every cut strictly inside the declared bounds as a point of its own: an exact value
    (`income == x`, `income in (...)`, a closed `between` end, `income < x or income > x`) is a
    place a person can be, and without its point the "no" branch of a probe
    `C or (age >= 96 and income in (...))` equals `C` on the grid, so it was released as a
    repeat while the "yes" branch was refused: a membership oracle. The declared bounds' own
    values get no point: `income > 0` under bounds (0, ...) stays a zero the metadata implies
    (what that leaves learnable, one probe at a time, is whether someone has exactly a
    declared bound's value)."""
    marks = sorted(set(cuts) | (set(bounds) if bounds is not None else set()))
    if bounds is not None:
        marks = [m for m in marks if bounds[0] <= m <= bounds[1]]
    if not marks:
        return [0] if integer else [0.0]
    between = {(a + b) / 2 for a, b in pairwise(marks)}
    if bounds is None:
        between |= {marks[0] - 1, marks[-1] + 1}
    if not integer:
        exact = {m for m in marks if bounds is None or bounds[0] < m < bounds[1]}
        return sorted(between | exact) or [marks[0]]
    ints: set[int] = set()
    for x in set(marks) | between:
        for y in (math.floor(x) - 1, math.floor(x), math.ceil(x), math.ceil(x) + 1):
            if bounds is None or bounds[0] <= y <= bounds[1]:
                ints.add(int(y))
    return sorted(ints)


def _filler(col: Column) -> Any:
    if col.type == "date":
        return (col.date_bounds[0] if col.date_bounds else date(2000, 1, 1)).isoformat()
    if col.type in ("categorical", "ordinal"):
        return (col.levels or ["(any)"])[0]
    if col.bounds is not None:
        return col.bounds[0]
    if col.scale is not None:
        return col.scale[0]
    return 0


def _typed(col: Column, values: list[Any]) -> Any:
    if col.type == "date":
        return pd.to_datetime(pd.Series(values, dtype=object), format="%Y-%m-%d")
    if col.type in ("categorical", "ordinal"):
        return pd.Series(values, dtype=object)
    missing = any(v is None for v in values)
    if col.type in ("integer", "identifier"):
        if missing:  # as the data hold a missing integer: pandas' nullable integers
            return pd.array([None if v is None else int(v) for v in values], dtype="Int64")
        return np.asarray([int(v) for v in values], dtype=np.int64)
    if missing:
        return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
    return np.asarray(values, dtype=np.float64)
