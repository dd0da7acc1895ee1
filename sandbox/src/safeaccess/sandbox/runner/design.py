"""Build regression design matrices from a parsed formula, without patsy.

Patsy evaluates formula text as Python, so the sandbox builds matrices itself from our own AST.
The coding follows patsy's rules so that results match what statisticians get from
statsmodels' formula API:

* treatment (dummy) coding with the first level as reference: the declared level order when the
  metadata lists levels, the category order of a pandas Categorical, otherwise sorted values;
  levels absent from the rows used are dropped, so no column is identically zero;
* a column declared categorical or ordinal is categorical even without `C()`;
* interactions are coded full-rank where the lower-order terms they contain are missing (patsy's
  redundancy algorithm), and columns come in patsy's order: terms without numeric factors first,
  then grouped by their numeric factors, each group by degree;
* rows with a missing value in any column used are dropped (listwise deletion).

Error messages never quote data values: they reach the researcher.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from safeaccess.client.grammar import (
    Call,
    Categorical,
    Factor,
    Filter,
    Formula,
    GrammarError,
    Numeric,
    Power,
    Term,
    Var,
    factor_column,
    factor_name,
    formula_columns,
    parse_formula,
)
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.sandbox.runner.filters import row_mask

#: Refuse designs wider than this: a categorical with thousands of levels is an error, not a model.
MAX_COLUMNS = 2000
_CATEGORICAL_TYPES = ("categorical", "ordinal")


class DesignError(ValueError):
    """The formula cannot be turned into a design matrix for this data."""


@dataclass(frozen=True)
class TermInfo:
    """One column of X: its name, whether a categorical factor enters it, whether it is 0/1.

    `binary` is True for a column whose values are all 0 or 1 (dummies and their interactions,
    or a 0/1 numeric column); it is False for the intercept. `nonzero` counts the rows where the
    column is not 0 — for a dummy, the number of records behind its coefficient.
    """

    name: str
    categorical: bool
    binary: bool
    nonzero: int = 0
    #: The categorical columns whose dummies multiply into this column (`Design.codes` holds
    #: their level codes): the query-set auditor crosses the partitions they make (issue 41).
    factors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Design:
    """Response vector, design matrix and what each column means."""

    y: np.ndarray
    X: np.ndarray
    y_name: str
    columns: list[str]
    rows: np.ndarray
    terms: list[TermInfo]
    formula: Formula
    levels: dict[str, list[object]] = field(default_factory=dict)
    #: The level code (index into `levels`) of each row used, per categorical column.
    codes: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def n(self) -> int:
        """Number of records used."""
        return int(self.X.shape[0])

    @property
    def has_intercept(self) -> bool:
        return self.formula.intercept


def design_matrices(
    frame: pd.DataFrame,
    formula: str | Formula,
    metadata: DatasetMetadata | None = None,
    *,
    where: str | Filter | None = None,
) -> Design:
    """Build (y, X) for `formula` on `frame`, restricted to the rows `where` keeps.

    `rows` in the result are positions in `frame` (not index labels) of the records used.
    Raises `DesignError` for grammar errors, unknown or unsuitable columns, and transforms that
    are undefined on the data (log of a non-positive value, ...); `FilterError` for a bad `where`.
    """
    if isinstance(formula, str):
        try:
            formula = parse_formula(formula)
        except GrammarError as exc:
            raise DesignError(f"invalid formula: {exc}") from exc
    builder = _Builder(frame, formula, metadata)
    return builder.build(row_mask(frame, where))


@dataclass
class _Factor:
    """A factor evaluated on the rows used: numeric values, or level codes for a categorical."""

    categorical: bool
    values: np.ndarray | None = None  # float64, numeric factors
    codes: np.ndarray | None = None  # int, categorical factors
    levels: list[object] = field(default_factory=list)


class _Builder:
    def __init__(self, frame: pd.DataFrame, formula: Formula, metadata: DatasetMetadata | None):
        self.frame = frame
        self.formula = formula
        self.metadata = metadata
        for name in sorted(formula_columns(formula)):
            if name not in frame.columns:
                raise DesignError(f"the formula uses column {name!r}, which is not in the dataset")
            col = metadata.column(name) if metadata else None
            if col is not None and col.type == "identifier":
                raise DesignError(f"column {name!r} is an identifier and cannot be used in a model")

    # ----------------------------------------------------------------------------- factor types

    def _declared_categorical(self, name: str) -> bool:
        col = self.metadata.column(name) if self.metadata else None
        if col is not None:
            return col.type in _CATEGORICAL_TYPES
        dtype = self.frame[name].dtype
        return not pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype)

    def is_categorical(self, f: Factor) -> bool:
        if isinstance(f, Categorical):
            return True
        if isinstance(f, Var):
            return self._declared_categorical(f.name)
        return False

    # ------------------------------------------------------------------------------- evaluation

    def _numeric_column(self, name: str, rows: np.ndarray, what: str) -> np.ndarray:
        series = self.frame[name].iloc[rows]
        if isinstance(series.dtype, pd.CategoricalDtype):
            series = series.astype(object)
        if not (
            pd.api.types.is_numeric_dtype(series.dtype)
            or pd.api.types.infer_dtype(series, skipna=True)
            in ("integer", "floating", "mixed-integer-float", "boolean", "empty")
        ):
            raise DesignError(
                f"{what} needs a numeric column, but {name!r} holds text; "
                f"use C({name}) to treat it as categorical"
            )
        return np.asarray(series, dtype=np.float64)

    def _numeric(self, f: Numeric, rows: np.ndarray, what: str) -> np.ndarray:
        if isinstance(f, Var):
            return self._numeric_column(f.name, rows, what)
        name = factor_name(f)
        column = factor_column(f)
        if self._inner_categorical(f):
            raise DesignError(
                f"{name} transforms column {column!r}, which is categorical; "
                "transforms need a numeric column"
            )
        if isinstance(f, Power):
            base = self._numeric(f.base, rows, what)
            with np.errstate(over="ignore", invalid="ignore"):
                out = base**f.exponent
        else:
            x = self._numeric(f.arg, rows, what)
            out = self._transform(f, x, column)
        if not np.all(np.isfinite(out)):
            raise DesignError(
                f"{name} overflows for some rows used; rescale column {column!r} first"
            )
        return np.asarray(out, dtype=np.float64)

    def _inner_categorical(self, f: Numeric) -> bool:
        if isinstance(f, Var):
            return self._declared_categorical(f.name)
        return self._inner_categorical(f.arg if isinstance(f, Call) else f.base)

    @staticmethod
    def _transform(f: Call, x: np.ndarray, column: str) -> np.ndarray:
        name = factor_name(f)
        if f.func == "log" and np.any(x <= 0):
            raise DesignError(
                f"{name}: column {column!r} has zero or negative values in the rows used; "
                f"filter them out (e.g. where '{column} > 0') or use log1p()"
            )
        if f.func == "log1p" and np.any(x <= -1):
            raise DesignError(
                f"{name}: column {column!r} has values of -1 or less in the rows used"
            )
        if f.func == "sqrt" and np.any(x < 0):
            raise DesignError(
                f"{name}: column {column!r} has negative values in the rows used; "
                "sqrt() needs values of 0 or more"
            )
        with np.errstate(over="ignore"):
            if f.func == "log":
                return np.log(x)
            if f.func == "log1p":
                return np.log1p(x)
            if f.func == "exp":
                return np.exp(x)
            if f.func == "sqrt":
                return np.sqrt(x)
            return np.abs(x)

    def _levels(self, name: str, rows: np.ndarray) -> tuple[np.ndarray, list[object]]:
        """Level codes (0 = reference) of a categorical column on the rows used, and the levels.

        Vectorised with `pd.factorize`: only the distinct values are handled in Python.
        """
        series = self.frame[name].iloc[rows]
        raw_codes, uniques = pd.factorize(series.to_numpy(dtype=object))
        distinct = [_plain(u) for u in uniques]
        col = self.metadata.column(name) if self.metadata else None
        if col is not None and col.levels is not None:
            lookup: dict[object, int] = {}
            for i, lvl in enumerate(col.levels):
                lookup.setdefault(lvl, i)
                lookup.setdefault(str(lvl), i)
            declared: list[int] = []
            for v in distinct:
                idx = lookup.get(v, lookup.get(str(v)))
                if idx is None:
                    raise DesignError(
                        f"column {name!r} holds a value that is not among its declared levels; "
                        "ask the data controller to correct the metadata"
                    )
                declared.append(idx)
            used = sorted(set(declared))
            position = {i: k for k, i in enumerate(used)}
            remap = np.array([position[i] for i in declared], dtype=np.int64)
            return remap[raw_codes], [col.levels[i] for i in used]
        present = set(distinct)
        if isinstance(self.frame[name].dtype, pd.CategoricalDtype):
            ordered = [_plain(c) for c in self.frame[name].cat.categories if _plain(c) in present]
        else:
            try:
                ordered = sorted(present)  # type: ignore[type-var]
            except TypeError:
                ordered = sorted(present, key=lambda v: (type(v).__name__, str(v)))
        rank = {lvl: k for k, lvl in enumerate(ordered)}
        remap = np.array([rank[v] for v in distinct], dtype=np.int64)
        return remap[raw_codes], list(ordered)

    # ---------------------------------------------------------------------------------- build

    def build(self, keep: np.ndarray) -> Design:
        formula = self.formula
        mask = keep.copy()
        for name in formula_columns(formula):
            mask &= ~np.asarray(pd.isna(self.frame[name]), dtype=bool)
        rows = np.flatnonzero(mask)

        y_name = factor_name(formula.response)
        if isinstance(formula.response, Var) and not self._numeric_ok(formula.response.name):
            raise DesignError(
                f"the response {y_name!r} holds text; a model needs a numeric response "
                "(code a binary outcome as 0/1)"
            )
        y = self._numeric(formula.response, rows, "the response")

        evaluated: dict[Factor, _Factor] = {}
        levels_by_column: dict[str, list[object]] = {}
        codes_by_column: dict[str, np.ndarray] = {}
        for term in formula.terms:
            for f in term:
                if f in evaluated:
                    continue
                if self.is_categorical(f):
                    column = factor_column(f)
                    codes, levels = self._levels(column, rows)
                    levels_by_column[column] = levels
                    codes_by_column[column] = np.asarray(codes, dtype=np.int64)
                    evaluated[f] = _Factor(True, codes=codes, levels=levels)
                else:
                    assert not isinstance(f, Categorical)
                    values = self._numeric(f, rows, factor_name(f))
                    evaluated[f] = _Factor(False, values=values)

        names: list[str] = []
        blocks: list[np.ndarray] = []
        infos: list[TermInfo] = []
        n = len(rows)
        for term, codings in _codings(formula, evaluated):
            for coding in codings:
                factors = tuple(
                    sorted({factor_column(f) for f in term if evaluated[f].categorical})
                )
                for name, values, categorical in _subterm_columns(term, coding, evaluated, n):
                    names.append(name)
                    blocks.append(values)
                    is_intercept = not term
                    binary = not is_intercept and bool(np.all((values == 0) | (values == 1)))
                    infos.append(
                        TermInfo(name, categorical, binary, int(np.count_nonzero(values)), factors)
                    )
                    if len(names) > MAX_COLUMNS:
                        raise DesignError(
                            f"the design has more than {MAX_COLUMNS} columns; "
                            "a categorical factor has too many levels"
                        )
        X = np.column_stack(blocks) if blocks else np.zeros((n, 0), dtype=np.float64)
        return Design(
            y=y,
            X=np.ascontiguousarray(X, dtype=np.float64),
            y_name=y_name,
            columns=names,
            rows=rows,
            terms=infos,
            formula=formula,
            levels=levels_by_column,
            codes=codes_by_column,
        )

    def _numeric_ok(self, name: str) -> bool:
        series = self.frame[name]
        if isinstance(series.dtype, pd.CategoricalDtype):
            series = series.astype(object)
        if pd.api.types.is_numeric_dtype(series.dtype):
            return True
        return pd.api.types.infer_dtype(series, skipna=True) in (
            "integer",
            "floating",
            "mixed-integer-float",
            "boolean",
            "empty",
        )


def _plain(value: object) -> object:
    """A numpy scalar as the Python scalar it holds, so levels compare and print plainly."""
    item = getattr(value, "item", None)
    return item() if callable(item) and isinstance(value, np.generic) else value


# -------------------------------------------------------------------------- patsy's term coding
#
# For each term, its categorical factors are coded full-rank ("[lvl]") or reduced ("[T.lvl]")
# so that the columns added span exactly what the lower-order terms already present do not.
# Terms sharing the same numeric factors are processed together, lowest degree first.

_Coded = tuple[Factor, bool]  # (categorical factor, coded full-rank?)


def _codings(
    formula: Formula, evaluated: dict[Factor, _Factor]
) -> list[tuple[Term, list[dict[Factor, bool]]]]:
    """Terms in design order, each with the list of codings of its subterms (left to right)."""
    all_terms: list[Term] = ([()] if formula.intercept else []) + list(formula.terms)
    buckets: dict[frozenset[Factor], list[Term]] = {}
    for term in all_terms:
        key = frozenset(f for f in term if not evaluated[f].categorical)
        buckets.setdefault(key, []).append(term)
    order = list(buckets)
    if frozenset() in buckets:
        order.remove(frozenset())
        order.insert(0, frozenset())
    out: list[tuple[Term, list[dict[Factor, bool]]]] = []
    for key in order:
        used: set[frozenset[_Coded]] = set()
        for term in sorted(buckets[key], key=len):
            categorical = [f for f in term if evaluated[f].categorical]
            out.append((term, _pick_codings(categorical, used)))
    return out


def _pick_codings(
    categorical: list[Factor], used: set[frozenset[_Coded]]
) -> list[dict[Factor, bool]]:
    subterms: list[frozenset[_Coded]] = []
    for size in range(len(categorical) + 1):
        for combo in itertools.combinations(categorical, size):
            sub = frozenset((f, False) for f in combo)
            if sub not in used:
                subterms.append(sub)
    used.update(subterms)
    # Greedily merge a subterm into a later one with exactly one more (reduced) factor, making
    # that factor full-rank: a- + a-:b-  ->  a-:b+ ... as patsy does.
    merged = True
    while merged:
        merged = False
        for i, short in enumerate(subterms):
            for j in range(i + 1, len(subterms)):
                long = subterms[j]
                if len(long) - len(short) == 1 and long > short:
                    ((extra, _),) = long - short
                    subterms[j] = short | {(extra, True)}
                    subterms.pop(i)
                    merged = True
                    break
            if merged:
                break
    return [dict(sub) for sub in subterms]


def _subterm_columns(
    term: Term, coding: dict[Factor, bool], evaluated: dict[Factor, _Factor], n: int
) -> Iterable[tuple[str, np.ndarray, bool]]:
    """The columns of one subterm: products of per-factor columns, first factor varying fastest."""
    if not term:
        yield "Intercept", np.ones(n, dtype=np.float64), False
        return
    per_factor: list[list[tuple[str, np.ndarray]]] = []
    any_categorical = False
    for f in term:
        ev = evaluated[f]
        name = factor_name(f)
        if not ev.categorical:
            assert ev.values is not None
            per_factor.append([(name, ev.values)])
        elif f in coding:
            any_categorical = True
            assert ev.codes is not None
            full = coding[f]
            chosen = ev.levels if full else ev.levels[1:]
            start = 0 if full else 1
            cols = []
            for k, lvl in enumerate(chosen, start=start):
                label = f"{name}[{lvl}]" if full else f"{name}[T.{lvl}]"
                cols.append((label, (ev.codes == k).astype(np.float64)))
            per_factor.append(cols)
    if np.prod([len(p) for p in per_factor], dtype=np.float64) > MAX_COLUMNS:
        raise DesignError(
            f"term {':'.join(factor_name(f) for f in term)} needs more than {MAX_COLUMNS} "
            "columns; a categorical factor has too many levels"
        )
    for combo in itertools.product(*reversed(per_factor)):
        parts = list(reversed(combo))
        label = ":".join(p[0] for p in parts)
        value = np.ones(n, dtype=np.float64)
        for _, v in parts:
            value = value * v
        yield label, value, any_categorical


__all__ = ["MAX_COLUMNS", "Design", "DesignError", "TermInfo", "design_matrices"]
