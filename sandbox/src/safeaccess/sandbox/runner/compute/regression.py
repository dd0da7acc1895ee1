"""Regressions (OLS, logit, probit, Poisson) with statsmodels -> RegressionOutput.

The design (y, X, listwise deletion) comes from `safeaccess.sandbox.runner.design`, which parses the
formula with our own grammar (patsy would evaluate code). statsmodels is imported here only, so
other analyses do not pay for it. Residuals and fitted values are never part of the output.
"""

from __future__ import annotations

import itertools
import warnings
from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd

from safeaccess.client.analyses import Regression
from safeaccess.client.grammar.formulas import formula_columns, parse_formula
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.facts import residual_spread
from safeaccess.rules.outputs import (
    WEIGHTED_LABEL,
    Coefficient,
    QuerySet,
    RegressionFacts,
    RegressionOutput,
    RegressorFacts,
    SummaryVariableFacts,
    TransformStep,
)
from safeaccess.sandbox.runner.compute import missing
from safeaccess.sandbox.runner.compute import summary as summary_compute
from safeaccess.sandbox.runner.compute._common import AnalysisError, fnum, query_set
from safeaccess.sandbox.runner.compute.bounds import record_bounds
from safeaccess.sandbox.runner.compute.leverage import glm_weights, hat_values, leverage_facts

INTERCEPT_NAMES = frozenset({"Intercept", "const", "(Intercept)"})
#: A numeric column with at most this many distinct values among the records used has its level
#: sets admitted to the query-set auditor: several fits with transforms of it (x, x², x³, …) on
#: one set release each value group's total. Columns with more values are left to the leverage
#: and model checks (their level sets are mostly single records, and as many fits as values
#: would be needed).
FEW_VALUES = 10
SEPARATION_MESSAGE = (
    "the regressors perfectly predict the outcome, so the estimates do not exist; "
    "merge sparse categories or drop the separating regressor"
)


def _fit(family: str, y: np.ndarray, x: np.ndarray) -> Any:
    import statsmodels.api as sm
    from statsmodels.tools.sm_exceptions import (
        ConvergenceWarning,
        HessianInversionWarning,
        PerfectSeparationError,
        PerfectSeparationWarning,
    )

    if family in ("logit", "probit"):
        outcomes = np.unique(y)
        if not np.all(np.isin(outcomes, (0.0, 1.0))):
            raise AnalysisError(
                "bad_outcome", f"{family} needs an outcome coded 0/1; recode the outcome variable"
            )
        if outcomes.size < 2:
            raise AnalysisError(
                "bad_outcome", f"{family} needs both outcomes 0 and 1 among the records used"
            )
    if family == "poisson" and (np.any(y < 0) or not np.all(np.mod(y, 1) == 0)):
        raise AnalysisError("bad_outcome", "poisson needs a non-negative integer count outcome")
    with warnings.catch_warnings(record=True) as caught:
        # Record statsmodels' quiet warnings: an estimate that did not converge or rests on
        # perfect separation must not be released as if it were sound.
        warnings.simplefilter("always")
        try:
            if family == "ols":
                result = sm.OLS(y, x).fit()
            else:
                model = {"logit": sm.Logit, "probit": sm.Probit, "poisson": sm.Poisson}[family]
                result = model(y, x).fit(method="newton", maxiter=100, disp=0)
        except PerfectSeparationError as exc:
            raise AnalysisError("perfect_separation", SEPARATION_MESSAGE) from exc
        except np.linalg.LinAlgError as exc:
            raise AnalysisError(
                "singular", "the design matrix is singular; remove collinear regressors"
            ) from exc
    kinds = {type(w.message) for w in caught}
    if family in ("logit", "probit"):
        index = x @ np.asarray(result.params)
        # (Quasi-)complete separation: the linear predictor the optimiser ended with puts every 1
        # at or above every 0. Then the likelihood has no maximum and the "estimates" are
        # wherever the optimiser stopped.
        if PerfectSeparationWarning in kinds or index[y == 1].min() >= index[y == 0].max():
            raise AnalysisError("perfect_separation", SEPARATION_MESSAGE)
    if kinds & {ConvergenceWarning, HessianInversionWarning}:
        raise AnalysisError(
            "no_convergence",
            "the model did not converge; simplify the model or merge sparse categories",
        )
    return result


def _fit_stats(family: str, result: Any) -> dict[str, float | None]:
    # A fit with a constant outcome (the query-set grid's synthetic rows, say) has no R²: numpy
    # divides by a zero total sum of squares, and `fnum` turns the inf or nan into None. Its
    # RuntimeWarning would only be noise on the server's console.
    with np.errstate(divide="ignore", invalid="ignore"):
        return _fit_stats_of(family, result)


def _fit_stats_of(family: str, result: Any) -> dict[str, float | None]:
    stats: dict[str, float | None] = {
        "llf": fnum(result.llf),
        "aic": fnum(result.aic),
        "bic": fnum(result.bic),
    }
    if family == "ols":
        stats.update(
            r2=fnum(result.rsquared),
            adj_r2=fnum(result.rsquared_adj),
            f_statistic=fnum(result.fvalue) if result.df_model > 0 else None,
            f_p_value=fnum(result.f_pvalue) if result.df_model > 0 else None,
        )
    else:
        stats.update(
            pseudo_r2=fnum(result.prsquared),
            llnull=fnum(result.llnull),
            llr=fnum(result.llr),
            llr_p_value=fnum(result.llr_pvalue),
        )
    return stats


def _transform_steps(expr: Any) -> list[TransformStep]:
    """The transform a numeric formula expression applies to its column, innermost first."""
    from safeaccess.client.grammar import Call, Power

    if isinstance(expr, Call):
        return [*_transform_steps(expr.arg), TransformStep(func=expr.func)]
    if isinstance(expr, Power):
        return [*_transform_steps(expr.base), TransformStep(func="power", exponent=expr.exponent)]
    return []


def outcome_facts(
    design: Any,
    y: np.ndarray,
    frame: pd.DataFrame,
    metadata: DatasetMetadata,
    where: str | None,
) -> SummaryVariableFacts:
    """The outcome over the model's records as a summary of it would record it.

    Every family's fit gives the outcome's total (the score equations make X'y = X'mu, and the
    standard errors give X'WX), OLS also its sum of squares (R^2 with the residual spread): a
    summary's count, mean and sd in another form, so the rules check them as one (filters on
    the outcome are bounds, spread concentration, dominance, reconstruction on small scales).
    A transformed outcome (`log(income) ~ ...`) keeps the filter's bounds on its column, on the
    column's own scale, with the transform that leads from it to the values (`transform`): the
    rules compare what the release leaves of a record with its prior range on that scale. It
    has no declared scale (the small-integer reconstruction is of the column's values)."""
    from safeaccess.client.grammar import Var, factor_column

    response = design.formula.response
    rows = np.asarray(design.rows, dtype=np.int64)
    column = factor_column(response)
    plain = isinstance(response, Var)
    bounds: tuple[np.ndarray, ...] | None = None
    if column in frame.columns:
        found = record_bounds(where, frame, column, summary_compute._declared(column, metadata))
        if found is not None:
            bounds = tuple(a[rows] for a in found)
    unit = metadata.contributor_column
    units = frame[unit].to_numpy()[rows] if unit is not None and unit in frame.columns else None
    facts = summary_compute._facts(
        np.asarray(y, dtype=np.float64),
        summary_compute._scale(column, metadata) if plain else None,
        units,
        bounds,
        plain and summary_compute._is_integer(column, metadata),
    )
    if plain or facts.bounds is None:
        return facts
    return facts.model_copy(update={"transform": _transform_steps(response)})


def _regressor_facts(design: Any, x: np.ndarray, columns: list[str]) -> list[RegressorFacts]:
    """Binary regressors with their counts of ones and zeros (one per dummy column)."""
    facts: list[RegressorFacts] = []
    for term in design.terms:
        if term.name in INTERCEPT_NAMES:
            continue
        if term.name in columns:
            matched = [term.name]
        else:
            matched = [c for c in columns if c.startswith(term.name) and c not in INTERCEPT_NAMES]
        for name in matched or [term.name]:
            if name not in columns:
                facts.append(RegressorFacts(term=name, binary=bool(term.binary)))
                continue
            col = x[:, columns.index(name)]
            binary = bool(np.all(np.isin(col, (0.0, 1.0))))
            if binary:
                ones = int((col == 1.0).sum())
                facts.append(
                    RegressorFacts(term=name, binary=True, ones=ones, zeros=int(col.size - ones))
                )
            else:
                facts.append(RegressorFacts(term=name, binary=False))
    return facts


def subgroup_query_sets(
    design: Any,
    x: np.ndarray,
    frame: pd.DataFrame,
    n_records: int,
    family: str = "ols",
    params: np.ndarray | None = None,
) -> list[QuerySet]:
    """The sub-groups a fit releases totals over, as partitions of the model's records and, for
    a numeric column with few values, as weighted rows over its value groups.

    X'y and X'X hold, for each 0/1 column (a dummy, or a product of dummies for an interaction),
    the totals over the records where it is 1: each such column gives one partition (identical
    partitions are given once). A numeric column with at most `FEW_VALUES` distinct values x_c
    releases the weighted sums Σ_c x_c · T_c (X'y, and the same row over every power of the
    outcome through the likelihood and the standard errors) and Σ_c x_c² · n_c (X'X's
    diagonal): two weighted rows over its value groups (issue 41), so one fit determines no
    group's total, while fits with other transforms of the column on one set add up to every
    group's total in the auditor as they do for the researcher (docs/qss.md). A logit or
    Poisson fit adds its weighted Hessian and likelihood rows (`_glm_pattern_rows`); a probit's
    few-valued numeric columns are admitted as their value groups (the strict rule)."""
    rows = np.asarray(design.rows, dtype=np.int64)
    sets: list[QuerySet] = []
    by_partition: dict[bytes, QuerySet] = {}
    weighted_family = family in ("ols", *_CANONICAL)
    blocks: list[_Block] = []
    few_valued: list[tuple[str, np.ndarray, np.ndarray, bytes]] = []
    sharing: dict[bytes, list[tuple[str, np.ndarray]]] = defaultdict(list)
    term_cells: dict[tuple[str, ...], tuple[np.ndarray, list[str]]] = {}
    for j, info in enumerate(design.terms):
        if info.name in INTERCEPT_NAMES:
            continue
        values, codes = np.unique(x[:, j], return_inverse=True)
        if values.size < 2 or (not info.binary and values.size > FEW_VALUES):
            continue
        zero_one = info.binary or bool(np.all(np.isin(values, (0.0, 1.0))))
        numeric = weighted_family and not zero_one
        key = codes.astype(np.int32).tobytes()
        if zero_one:
            block = _block_of(design, info, x[:, j], term_cells)
            if all(b.key != block.key for b in blocks):  # a term's dummies: its cells once
                blocks.append(block)
        else:
            few_valued.append((str(info.name), values, codes.reshape(-1), key))
        qs = by_partition.get(key)
        if qs is None:
            cell = np.full(len(frame), -1, dtype=np.int64)
            cell[rows] = codes
            labels = [f"{info.name} = {v:g}" for v in values]
            qs = by_partition[key] = query_set(labels, frame, cell, n_records)
            sets.append(qs)
        elif not numeric or qs.weights is None:
            continue  # a 0/1 partition given before, or this one is (given once)
        if numeric:
            # x, x², x³ of one column share its partition: one set, their rows together (the
            # floats the fit used, and their squares as the sandbox evaluates them)
            weights, names = list(qs.weights or []), list(qs.row_labels or [])
            # and X'X's entries between them (x · x² = x³ for x and x² in one fit)
            products = [(u * values, f"{other}*{info.name}") for other, u in sharing[key]]
            for row, name in (
                (values, info.name),
                (values * values, f"{info.name}^2"),
                *products,
            ):
                listed = row.tolist()
                if listed not in weights:
                    weights.append(listed)
                    names.append(f"{WEIGHTED_LABEL}{name}")
            qs.weights, qs.row_labels = weights, names
            sharing[key].append((str(info.name), values))
    sets += _cross_query_sets(blocks, few_valued, by_partition, rows, frame, n_records)
    sets += _numeric_pairs(few_valued, weighted_family, rows, frame, n_records)
    if any(q.weighted for q in sets) and family in _CANONICAL:
        glm = (
            None
            if params is None
            else _glm_pattern_rows(design, x, frame, n_records, family, params)
        )
        if glm is None:
            # the Hessian's rows vary within the groups: the value groups themselves (strict)
            for q in sets:
                q.weights = q.row_labels = None
        else:
            sets.append(glm)
    return sets


class _Block:
    """The partition of a model's records by the levels that make one 0/1 design column: its
    categorical factors' levels and, for a column with a numeric part (a 0/1 numeric regressor,
    or a product with one), its value. `codes` numbers the cells over the records used."""

    def __init__(self, key: tuple[str, ...], codes: np.ndarray, labels: list[str]):
        self.key, self.codes, self.labels = key, codes, labels


def _joint(
    codes: list[np.ndarray], labels: list[list[str]], join: str = ", "
) -> tuple[np.ndarray, list[str]]:
    """The cells of several partitions of the same records crossed (only the cells that occur),
    numbered in the order of their labels' parts, and each cell's label."""
    combined = np.zeros(codes[0].size, dtype=np.int64)
    size = 1
    for c, names in zip(codes, labels, strict=True):
        combined = combined * max(len(names), 1) + c
        size *= max(len(names), 1)
    if size <= 1 << 22:
        # small key space: the cells that occur by one counting pass, not a sort (10 M records)
        occurs = np.bincount(combined, minlength=size) > 0
        cells = np.flatnonzero(occurs)
        number = np.cumsum(occurs) - 1
        inverse = number[combined]
    else:
        cells, inverse = np.unique(combined, return_inverse=True)
    out: list[str] = []
    for cell in cells.tolist():
        parts: list[str] = []
        rest = int(cell)
        for names in reversed(labels):
            rest, at = divmod(rest, max(len(names), 1))
            parts.append(names[at])
        out.append(join.join(reversed(parts)))
    return inverse.reshape(-1).astype(np.int64), out


def _block_of(
    design: Any,
    info: Any,
    column: np.ndarray,
    cache: dict[tuple[str, ...], tuple[np.ndarray, list[str]]],
) -> _Block:
    factors = [f for f in getattr(info, "factors", ()) if f in design.codes]
    codes = [np.asarray(design.codes[f], dtype=np.int64) for f in factors]
    labels = [[f"{f} = {level}" for level in design.levels[f]] for f in factors]
    key = tuple(factors)
    if factors and key not in cache:  # once per term, not per dummy column
        cache[key] = _joint(codes, labels)
    # a column that is not constant on its factors' cells has a numeric part: its value is
    # part of the cell (a 0/1 numeric regressor, alone or times dummies)
    if factors and _constant_on(cache[key][0], column):
        return _Block(key, *cache[key])
    codes.append((column == 1.0).astype(np.int64))  # a 0/1 column: its value is the code
    labels.append([f"{info.name} = 0", f"{info.name} = 1"])
    found, names = _joint(codes, labels)
    return _Block((*key, str(info.name)), found, names)


def _constant_on(cells: np.ndarray, column: np.ndarray) -> bool:
    one = np.full(int(cells.max()) + 1 if cells.size else 0, np.nan)
    one[cells] = column  # some row's value per cell: the column is constant on them iff all agree
    return bool(np.all(one[cells] == column))


def _cross_query_sets(
    blocks: list[_Block],
    few_valued: list[tuple[str, np.ndarray, np.ndarray, bytes]],
    by_partition: dict[bytes, QuerySet],
    rows: np.ndarray,
    frame: pd.DataFrame,
    n_records: int,
) -> list[QuerySet]:
    """X'X's cross terms (issue 41). The entry of two 0/1 columns from different terms is the
    count of the records where both are 1: the cells of the two terms crossed (`C(region) +
    C(sex)` releases every region x sex count, with the standard errors and the one-way
    counts), given as one partition per pair of terms. The entry of a 0/1 column and a
    few-valued numeric column x is sum x over the column's records: per cell of the 0/1 term,
    the weighted rows of x (its values and their squares, and those of its other transforms)
    over the groups cell x value of x. Pairs whose one term's cells refine the other's add
    nothing the terms' own sets do not give."""
    out: list[QuerySet] = []
    seen: set[bytes] = set()
    distinct = blocks

    def cell_array(codes: np.ndarray) -> np.ndarray:
        cell = np.full(len(frame), -1, dtype=np.int64)
        cell[rows] = codes
        return cell

    for a, b in itertools.combinations(distinct, 2):
        codes, labels = _joint([a.codes, b.codes], [a.labels, b.labels], " & ")
        if len(labels) <= max(len(a.labels), len(b.labels)):
            continue  # one term's cells refine the other's: no cross cell beyond them
        key = codes.astype(np.int32).tobytes()
        if key in seen:
            continue
        seen.add(key)
        out.append(query_set(labels, frame, cell_array(codes), n_records))
    for name, values, value_codes, partition in few_valued:
        qs = by_partition.get(partition)
        for block in distinct:
            value_labels = [f"{name} = {v:g}" for v in values]
            codes, labels = _joint([block.codes, value_codes], [block.labels, value_labels], " & ")
            if len(labels) <= len(value_labels):
                continue  # the term's cells do not split the value groups
            key = codes.astype(np.int32).tobytes()
            if key in seen:
                continue
            seen.add(key)
            cross = query_set(labels, frame, cell_array(codes), n_records)
            if qs is not None and qs.weights is not None:
                weights, names = _per_cell_rows(qs, block, value_codes, codes, len(labels))
                if weights:
                    cross.weights, cross.row_labels = weights, names
            out.append(cross)
    return out


def _numeric_pairs(
    few_valued: list[tuple[str, np.ndarray, np.ndarray, bytes]],
    weighted_family: bool,
    rows: np.ndarray,
    frame: pd.DataFrame,
    n_records: int,
) -> list[QuerySet]:
    """X'X's entry of two few-valued numeric columns that split the records differently
    (`income ~ children + visits`): Σ x·z, a weighted row over the groups children x visits
    (issue 41), one set per pair of partitions with the rows of every pair of their columns;
    for a probit (the strict rule) the groups themselves."""
    joint: dict[bytes, QuerySet] = {}
    out: list[QuerySet] = []
    for (na, va, ca, ka), (nb, vb, cb, kb) in itertools.combinations(few_valued, 2):
        if ka == kb:
            continue  # one partition: its own set has the products (`sharing`)
        labels_a = [f"{na} = {v:g}" for v in va]
        labels_b = [f"{nb} = {v:g}" for v in vb]
        codes, labels = _joint([ca, cb], [labels_a, labels_b], " & ")
        row: list[float] = []
        if weighted_family:
            first = np.zeros(len(labels), dtype=np.int64)
            second = np.zeros(len(labels), dtype=np.int64)
            first[codes], second[codes] = ca, cb
            row = (va[first] * vb[second]).tolist()
            if not any(w != 0.0 for w in row):
                continue  # columns never both nonzero (varying slopes of two levels): entry 0
        key = codes.astype(np.int32).tobytes()
        qs = joint.get(key)
        if qs is None:
            cell = np.full(len(frame), -1, dtype=np.int64)
            cell[rows] = codes
            qs = joint[key] = query_set(labels, frame, cell, n_records)
            out.append(qs)
        if not weighted_family:
            continue  # the strict rule: the joint groups themselves
        weights, names = list(qs.weights or []), list(qs.row_labels or [])
        if row not in weights:
            weights.append(row)
            names.append(f"{WEIGHTED_LABEL}{na}*{nb}")
        qs.weights, qs.row_labels = weights, names
    return out


def _per_cell_rows(
    qs: QuerySet, block: _Block, value_codes: np.ndarray, codes: np.ndarray, n_groups: int
) -> tuple[list[list[float]], list[str]]:
    """Per cell of the block, each weighted row of the value groups restricted to that cell."""
    cell_of = np.zeros(n_groups, dtype=np.int64)
    value_of = np.zeros(n_groups, dtype=np.int64)
    cell_of[codes] = block.codes
    value_of[codes] = value_codes
    weights: list[list[float]] = []
    names: list[str] = []
    for c, cell_label in enumerate(block.labels):
        inside = cell_of == c
        if not inside.any():
            continue
        for row, name in zip(qs.weights or [], qs.row_labels or [], strict=True):
            values = np.where(inside, np.asarray(row, dtype=np.float64)[value_of], 0.0)
            if np.any(values != 0.0):
                weights.append(values.tolist())
                names.append(f"{name} | {cell_label}")
    return weights, names


#: GLM families whose score equations are X'(y - mu) = 0 (canonical links): the outcome's
#: rows are the design columns, as for OLS.
_CANONICAL = ("logit", "poisson")


def _glm_pattern_rows(
    design: Any,
    x: np.ndarray,
    frame: pd.DataFrame,
    n_records: int,
    family: str,
    params: np.ndarray,
) -> QuerySet | None:
    """A canonical GLM's further weighted rows, over the design's patterns (records with the
    same row of X), when every column has few values (so that the fitted mean is constant on
    each pattern): its standard errors give X'WX, that is Σ_g n_g · w_g · x_gj · x_gl for every
    pair of columns, and its log-likelihood Σ_g n_g · b(η_g) (logit: log(1 + e^η); Poisson's
    e^η is w itself). Rows over record counts, which the auditor holds for every power of the
    outcome alike. None when some column has many values (its records' weights then vary
    within every group: the leverage rule covers such designs, docs/qss.md)."""
    names = [str(info.name) for info in design.terms]
    for j in range(x.shape[1]):
        if names[j] not in INTERCEPT_NAMES and np.unique(x[:, j]).size > FEW_VALUES:
            return None
    patterns, codes = np.unique(x, axis=0, return_inverse=True)
    if patterns.shape[0] > 127:  # joint patterns of few-valued columns: small in practice
        return None
    w = glm_weights(family, patterns, params)
    if w is None:
        return None
    eta = patterns @ np.asarray(params, dtype=np.float64)
    rows: list[list[float]] = []
    labels: list[str] = []
    for j in range(patterns.shape[1]):
        for k in range(j, patterns.shape[1]):
            row = w * patterns[:, j] * patterns[:, k]
            if np.any(row != 0.0) and np.all(np.isfinite(row)):
                rows.append(row.tolist())
                labels.append(f"{WEIGHTED_LABEL}w*{names[j]}*{names[k]}")
    if family == "logit":
        rows.append(np.logaddexp(0.0, eta).tolist())
        labels.append(f"{WEIGHTED_LABEL}log(1+exp(eta))")
    if not rows:
        return None
    cell = np.full(len(frame), -1, dtype=np.int64)
    cell[np.asarray(design.rows, dtype=np.int64)] = codes.reshape(-1)
    cells = [", ".join(f"{n} = {v:g}" for n, v in zip(names, p, strict=True)) for p in patterns]
    qs = query_set(cells, frame, cell, n_records)
    qs.weights = rows
    qs.row_labels = labels
    return qs


def regression(
    analysis: Regression, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> RegressionOutput:
    """Fit the model; coefficients with SE, statistic, p-value and 95% CI; fit statistics."""
    from safeaccess.sandbox.runner.design import design_matrices

    design = design_matrices(frame, analysis.formula, metadata)
    y = np.asarray(design.y, dtype=np.float64).reshape(-1)
    x = np.asarray(design.X, dtype=np.float64)
    columns = [str(c) for c in design.columns]
    rows = np.asarray(design.rows, dtype=np.int64)
    n, k = x.shape
    if n == 0:
        raise AnalysisError("no_rows", "no records left after the filter and missing values")
    if n <= k:
        raise AnalysisError(
            "too_few_rows",
            # Neither n nor k is named: n is an unchecked count of a small query set, and k
            # tells which categorical levels occur among those records.
            "too few records for the model's parameters; the model needs more records than "
            "parameters",
        )
    if np.linalg.matrix_rank(x) < k:
        raise AnalysisError(
            "singular",
            "the regressors are collinear (the design matrix is singular); remove redundant terms "
            "or categories with no records",
        )
    result = _fit(analysis.family, y, x)
    params = np.asarray(result.params)
    bse = np.asarray(result.bse)
    tvalues = np.asarray(result.tvalues)
    pvalues = np.asarray(result.pvalues)
    ci = np.asarray(result.conf_int(alpha=0.05))
    if not np.all(np.isfinite(params)):
        raise AnalysisError("no_convergence", "the model produced non-finite estimates")
    coefficients = [
        Coefficient(
            term=columns[i],
            estimate=float(params[i]),
            std_error=fnum(bse[i]),
            statistic=fnum(tvalues[i]),
            p_value=fnum(pvalues[i]),
            ci_low=fnum(ci[i, 0]),
            ci_high=fnum(ci[i, 1]),
        )
        for i in range(k)
    ]
    non_intercept = [t for t in design.terms if t.name not in INTERCEPT_NAMES]
    categorical_only = bool(non_intercept) and all(t.categorical for t in non_intercept)
    patterns = np.unique(x, axis=0).shape[0]
    used = np.zeros(len(frame), dtype=np.int64) - 1
    used[rows] = 0
    # Listwise deletion: the records with a missing value in a column of the formula.
    variables = sorted(formula_columns(parse_formula(analysis.formula)))
    left_out, left_out_sets = missing.listwise(variables, used >= 0, frame, n_records)
    facts = RegressionFacts(
        missing_query_sets=left_out_sets,
        n=n,
        df_resid=float(result.df_resid),
        df_model=float(result.df_model),
        categorical_only=categorical_only,
        saturated=bool(k >= patterns),
        regressors=_regressor_facts(design, x, columns),
        query_set=query_set(["model"], frame, used, n_records),
        extra_query_sets=subgroup_query_sets(design, x, frame, n_records, analysis.family, params),
        leverage=leverage_facts(hat_values(x, glm_weights(analysis.family, x, params))),
        # the residual sum of squares behind the OLS standard errors: one record may dominate it
        residual_spread=residual_spread(y - x @ params) if analysis.family == "ols" else None,
        outcome=outcome_facts(design, y, frame, metadata, analysis.where),
    )
    return RegressionOutput(
        family=analysis.family,
        formula=analysis.formula,
        n=n,
        df_resid=float(result.df_resid),
        df_model=float(result.df_model),
        coefficients=coefficients,
        fit=_fit_stats(analysis.family, result),
        missing=left_out,
        facts=facts,
    )
