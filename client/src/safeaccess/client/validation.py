"""Check an analysis against a dataset's metadata before it is bound into a sequence.

`validate(analysis, metadata)` collects every problem it finds — unknown columns (with close
matches suggested), identifier columns, columns of the wrong type for their role, filter and
formula grammar errors, filter values outside a column's declared levels — and raises one
`AnalysisInvalid` listing them all, each with the field it concerns. It never looks at data.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from datetime import date

from pydantic import ValidationError

from safeaccess.client.analyses import (
    Analysis,
    Correlation,
    DPCount,
    DPHistogram,
    DPMean,
    DPMeanTest,
    DPSum,
    FrequencyTable,
    Histogram,
    MagnitudeTable,
    ModelTraining,
    Regression,
    Script,
    StatTest,
    Summary,
    Survival,
    SyntheticData,
    parse_analysis,
)
from safeaccess.client.analysis_errors import AnalysisInvalid, Problem, problems_from
from safeaccess.client.dateparts import DATE_PARTS, looks_like_call, parse_part
from safeaccess.client.dpquery import LayoutError, declared_levels, layout
from safeaccess.client.grammar import (
    And,
    Between,
    Call,
    Categorical,
    Compare,
    Filter,
    Formula,
    GrammarError,
    In,
    IsNull,
    Not,
    Or,
    Power,
    Scalar,
    Var,
    factor_column,
    factor_name,
    parse_filter,
    parse_formula,
)
from safeaccess.client.grammar.limits import filter_size_problems
from safeaccess.client.metadata import Column, DatasetMetadata

#: Largest script accepted, in UTF-8 bytes.
MAX_SCRIPT_BYTES = 200_000

_KINDS = (
    FrequencyTable,
    MagnitudeTable,
    Summary,
    Regression,
    Correlation,
    Histogram,
    StatTest,
    Survival,
    Script,
    DPCount,
    DPSum,
    DPMean,
    DPHistogram,
    DPMeanTest,
    ModelTraining,
    SyntheticData,
)

# The fields that may name a date part (`year(admitted)`): the ones that group or select records.
_PART_FIELDS = frozenset({"rows", "cols", "by", "where"})

# Statistics that make sense for a column whose values are labels rather than numbers.
_LABEL_STATISTICS = frozenset({"count", "mode"})


def validate(
    analysis: Analysis | dict[str, object] | bytes | str, metadata: DatasetMetadata
) -> None:
    """Raise `AnalysisInvalid` listing every problem of `analysis` against `metadata`.

    `analysis` may also be an instruction body (JSON bytes/str or a dict); schema errors are
    reported as problems too.
    """
    if not isinstance(analysis, _KINDS):
        try:
            analysis = parse_analysis(analysis)
        except ValidationError as exc:
            raise AnalysisInvalid(problems_from(exc)) from None
    checker = _Checker(metadata)
    checker.check(analysis)
    if checker.problems:
        raise AnalysisInvalid(checker.problems)


def check_grammar(analysis: Analysis) -> None:
    """Raise `AnalysisInvalid` if the analysis' filter or formula is not in the grammar.

    The part of `validate` that needs no metadata, for checking a plan before the dataset's
    metadata is at hand.
    """
    problems: list[Problem] = []
    if analysis.where is not None:
        try:
            parsed = parse_filter(analysis.where)
        except GrammarError as exc:
            problems.append(Problem("where", str(exc)))
        else:
            problems.extend(Problem("where", p) for p in filter_size_problems(parsed))
    if isinstance(analysis, Regression):
        try:
            parse_formula(analysis.formula)
        except GrammarError as exc:
            problems.append(Problem("formula", str(exc)))
    if problems:
        raise AnalysisInvalid(problems)


def _numeric_levels(col: Column) -> bool:
    return bool(col.levels) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in col.levels or []
    )


def is_numeric(col: Column) -> bool:
    """Whether a column holds numbers that can be averaged or regressed on."""
    if col.type in ("integer", "continuous"):
        return True
    if col.type == "ordinal":
        return col.scale is not None or _numeric_levels(col)
    if col.type == "categorical":
        return _numeric_levels(col)
    return False


def is_grouping(col: Column) -> bool:
    """Whether a column can define groups or table cells (discrete, not an identifier)."""
    return col.type in ("categorical", "ordinal", "integer")


class _Checker:
    def __init__(self, metadata: DatasetMetadata) -> None:
        self.metadata = metadata
        self.problems: list[Problem] = []

    def add(self, field: str, message: str) -> None:
        problem = Problem(field, message)
        if problem not in self.problems:  # e.g. one unknown column used in several terms
            self.problems.append(problem)

    # ------------------------------------------------------------------------------- columns

    def column(self, field: str, name: str) -> Column | None:
        """The column called `name`, or None after recording why it cannot be used."""
        if "(" in name:
            return self.date_part(field, name)
        col = self.metadata.column(name)
        if col is None:
            names = [c.name for c in self.metadata.columns]
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
            if not close:
                close = [n for n in names if n.lower() == name.lower()]
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            self.add(field, f"unknown column {name!r} in dataset {self.metadata.name!r}{hint}")
            return None
        if col.type == "identifier":
            self.add(
                field,
                f"column {name!r} is an identifier; identifiers cannot be used in analyses",
            )
            return None
        if col.type == "date" and field != "where":
            self.add(
                field,
                f"column {name!r} is a date; a date column selects records in a filter "
                f"(where=\"{name} >= '2020-01-01'\") and groups them by year({name}), "
                f"month({name}) or day({name}), it is not analysed itself",
            )
            return None
        if col.type == "text":
            self.add(
                field,
                f"column {name!r} is free text; text columns are kept out of every analysis "
                "(filters, tables, models, scripts)",
            )
            return None
        return col

    def date_part(self, field: str, name: str) -> Column | None:
        """The derived column of a date part (`year(admitted)`), or None after recording why
        it cannot be used here: parts group records (table rows and columns, `by`) or select
        them (a filter), nothing else, and take a date column with declared date_bounds (their
        levels)."""
        parsed = parse_part(name)
        if parsed is None:
            func = looks_like_call(name)
            self.add(
                field,
                f"{name!r} is not a column; a date column is grouped by "
                + ", ".join(f"{p}(column)" for p in DATE_PARTS[:-1])
                + f" or {DATE_PARTS[-1]}(column)"
                + (f" (there is no {func}())" if func not in (None, *DATE_PARTS) else "")
                + ", written without spaces",
            )
            return None
        part, base = parsed
        col = self.metadata.column(base)
        if col is None or col.type in ("identifier", "text"):
            self.column(field, base)  # says why: unknown (with close matches) or hidden
            return None
        if col.type != "date":
            self.add(field, f"{part}() takes a date column, but {base!r} is {col.type}")
            return None
        if col.date_bounds is None:
            self.add(
                field,
                f"{name} needs the declared date_bounds of {base!r} (its levels come from "
                "them); the dataset's metadata declares none",
            )
            return None
        if field.split("[")[0] not in _PART_FIELDS:
            self.add(
                field,
                f"{name} groups records: use it in rows, cols, by or a filter; the "
                f"{field.split('[')[0]} of an analysis cannot be a date part",
            )
            return None
        return self.metadata.date_part(name)

    def grouping(self, field: str, name: str) -> None:
        col = self.column(field, name)
        if col is not None and not is_grouping(col):
            self.add(
                field,
                f"column {name!r} is {col.type}; only categorical, ordinal or integer columns "
                "can define groups or table cells (use a histogram to bin a continuous column)",
            )

    def numeric(self, field: str, name: str, what: str) -> Column | None:
        col = self.column(field, name)
        if col is not None and not is_numeric(col):
            self.add(
                field,
                f"{what} needs a numeric column, but {name!r} is {col.type}"
                + (" with text levels" if col.levels else ""),
            )
            return None
        return col

    def distinct(self, fields: Iterable[tuple[str, str]]) -> None:
        seen: dict[str, str] = {}
        for field, name in fields:
            if name in seen:
                self.add(field, f"column {name!r} is already used in {seen[name]}")
            else:
                seen[name] = field

    # ------------------------------------------------------------------------------ analyses

    def check(self, analysis: Analysis) -> None:
        where = self.where(analysis.where)
        if isinstance(analysis, FrequencyTable | MagnitudeTable):
            self.table(analysis)
        elif isinstance(analysis, Summary):
            self.summary(analysis)
        elif isinstance(analysis, Regression):
            self.regression(analysis)
        elif isinstance(analysis, Correlation):
            for i, name in enumerate(analysis.variables):
                self.numeric(f"variables[{i}]", name, f"{analysis.method} correlation")
            self.distinct((f"variables[{i}]", n) for i, n in enumerate(analysis.variables))
        elif isinstance(analysis, Histogram):
            self.histogram(analysis)
        elif isinstance(analysis, StatTest):
            self.stat_test(analysis, where)
        elif isinstance(analysis, Survival):
            self.survival(analysis)
        elif isinstance(analysis, DPCount | DPSum | DPMean | DPHistogram | DPMeanTest):
            self.dp(analysis)
        elif isinstance(analysis, ModelTraining):
            self.model_training(analysis)
        elif isinstance(analysis, SyntheticData):
            from safeaccess.client.synthetic import SynthInvalid, synth_workload

            parts = [(f"columns[{i}]", n) for i, n in enumerate(analysis.columns) if "(" in n]
            for field, name in parts:
                self.date_part(field, name)  # refused: synthetic data has no derived columns
            if parts:
                return
            try:
                synth_workload(analysis, self.metadata)
            except SynthInvalid as exc:
                for field, message in exc.problems:
                    self.add(field, message)
        elif isinstance(analysis, Script):
            size = len(analysis.code.encode("utf-8"))
            if size > MAX_SCRIPT_BYTES:
                self.add("code", f"the script is {size} bytes; the limit is {MAX_SCRIPT_BYTES}")

    def table(self, analysis: FrequencyTable | MagnitudeTable) -> None:
        dims = [(f"rows[{i}]", n) for i, n in enumerate(analysis.rows)]
        dims += [(f"cols[{i}]", n) for i, n in enumerate(analysis.cols)]
        for field, name in dims:
            self.grouping(field, name)
        if isinstance(analysis, MagnitudeTable):
            self.numeric("value", analysis.value, f"a table of the {analysis.agg}")
            dims.append(("value", analysis.value))
            if (
                analysis.agg in ("std", "mode")
                and analysis.margins
                and (analysis.mitigations.suppress)
            ):
                self.add(
                    "mitigations.suppress",
                    f"a {analysis.agg} table's margins cannot be recomputed from the cells left "
                    "after suppression; ask for margins=False or suppress=False",
                )
        self.distinct(dims)

    def summary(self, analysis: Summary) -> None:
        label_only = sorted(set(analysis.statistics) - _LABEL_STATISTICS)
        for i, name in enumerate(analysis.variables):
            col = self.column(f"variables[{i}]", name)
            if col is not None and not is_numeric(col) and label_only:
                self.add(
                    f"variables[{i}]",
                    f"column {name!r} is {col.type}; of the statistics asked only count and "
                    f"mode apply to it, not {', '.join(label_only)} "
                    "(use a frequency table for its distribution)",
                )
        for i, name in enumerate(analysis.by):
            self.grouping(f"by[{i}]", name)
        self.distinct(
            [(f"variables[{i}]", n) for i, n in enumerate(analysis.variables)]
            + [(f"by[{i}]", n) for i, n in enumerate(analysis.by)]
        )

    def histogram(self, analysis: Histogram) -> None:
        col = self.column("variable", analysis.variable)
        if col is not None and col.type not in ("integer", "continuous"):
            self.add(
                "variable",
                f"a histogram needs an integer or continuous column, but {analysis.variable!r} "
                f"is {col.type}; use a frequency table instead",
            )
        for i, name in enumerate(analysis.by):
            self.grouping(f"by[{i}]", name)
        self.distinct(
            [("variable", analysis.variable)] + [(f"by[{i}]", n) for i, n in enumerate(analysis.by)]
        )

    def survival(self, analysis: Survival) -> None:
        self.numeric("time", analysis.time, "a survival curve's time")
        col = self.numeric("event", analysis.event, "a survival curve's event indicator")
        if col is not None:
            levels = set(col.levels or [])
            if levels and not levels <= {0, 1, "0", "1"}:
                self.add(
                    "event",
                    f"the event indicator {analysis.event!r} must hold 1 (event) and 0 "
                    f"(censored), but its declared levels are {sorted(map(str, levels))}",
                )
            if col.bounds is not None and (col.bounds[0] < 0 or col.bounds[1] > 1):
                self.add(
                    "event",
                    f"the event indicator {analysis.event!r} must hold 1 (event) and 0 "
                    f"(censored), but its declared bounds are {list(col.bounds)}",
                )
        for i, name in enumerate(analysis.by):
            self.grouping(f"by[{i}]", name)
        self.distinct(
            [("time", analysis.time), ("event", analysis.event)]
            + [(f"by[{i}]", n) for i, n in enumerate(analysis.by)]
        )

    def stat_test(self, analysis: StatTest, where: Filter | None) -> None:
        if analysis.test == "chi2_independence":
            assert analysis.rows is not None and analysis.cols is not None
            for field, name in (("rows", analysis.rows), ("cols", analysis.cols)):
                col = self.column(field, name)
                if col is not None and col.type == "continuous":
                    self.add(
                        field,
                        f"a chi-squared test needs a categorical column, but {name!r} is "
                        "continuous",
                    )
            self.distinct([("rows", analysis.rows), ("cols", analysis.cols)])
            return
        assert analysis.variable is not None and analysis.group is not None
        self.numeric("variable", analysis.variable, "a t-test")
        col = self.column("group", analysis.group)
        if col is None:
            return
        if col.type not in ("categorical", "ordinal") and not (
            col.levels is not None and len(col.levels) == 2
        ):
            self.add(
                "group",
                f"the t-test group must be a categorical column with two levels, but "
                f"{analysis.group!r} is {col.type}",
            )
        elif col.levels is not None and len(col.levels) != 2:
            kept = _levels_kept(where, analysis.group)
            if kept is None or len(kept) != 2:
                self.add(
                    "group",
                    f"column {analysis.group!r} has {len(col.levels)} levels; a two-sample "
                    f"t-test needs two: keep two with a filter such as "
                    f'"{analysis.group} in ({", ".join(repr(v) for v in col.levels[:2])})"',
                )
        self.distinct([("variable", analysis.variable), ("group", analysis.group)])

    # --------------------------------------------------------------------- differential privacy

    def bounded(self, field: str, name: str, what: str) -> None:
        col = self.numeric(field, name, what)
        if col is not None and col.bounds is None:
            self.add(
                field,
                f"{what} needs declared bounds for {name!r} (the noise is calibrated to them); "
                "the dataset's metadata declares none, so this column cannot be used",
            )

    def dp_groups(self, field: str, name: str) -> None:
        col = self.column(field, name)
        if col is None:
            return
        if not is_grouping(col) or declared_levels(col) is None:
            self.add(
                field,
                f"column {name!r} declares no levels; DP answers group only by the declared "
                "levels of categorical or ordinal columns (never by levels seen in the data)",
            )

    def dp(self, analysis: DPCount | DPSum | DPMean | DPHistogram | DPMeanTest) -> None:
        used: list[tuple[str, str]] = []
        if isinstance(analysis, DPSum):
            self.bounded("variable", analysis.variable, "a DP sum")
            used.append(("variable", analysis.variable))
        elif isinstance(analysis, DPHistogram):
            self.bounded("variable", analysis.variable, "a DP histogram")
            used.append(("variable", analysis.variable))
        elif isinstance(analysis, DPMean | DPMeanTest):
            for i, name in enumerate(analysis.variables):
                self.bounded(f"variables[{i}]", name, f"a {analysis.kind}")
                used.append((f"variables[{i}]", name))
        if isinstance(analysis, DPMeanTest):
            col = self.column("group", analysis.group)
            levels = declared_levels(col) if col is not None else None
            if col is not None and (levels is None or len(levels) != 2):
                self.add(
                    "group",
                    f"a DP mean test compares two groups: column {analysis.group!r} must "
                    f"declare exactly two levels, but declares {len(levels or [])}",
                )
            used.append(("group", analysis.group))
        for i, name in enumerate(analysis.by):
            self.dp_groups(f"by[{i}]", name)
            used.append((f"by[{i}]", name))
        if isinstance(analysis, DPMeanTest) and analysis.sigma is not None:
            self.add(
                "sigma",
                "a DP mean test spends its budget over several statistics; give 'epsilon' and "
                "'delta' instead of 'sigma'",
            )
        if isinstance(analysis, DPMeanTest) and analysis.by:
            self.add("by", "a DP mean test compares the two levels of 'group'; drop 'by'")
        self.distinct(used)
        if self.problems:
            return
        try:
            shape = layout(analysis, self.metadata)
        except LayoutError as exc:
            self.add("analysis", str(exc))
            return
        transform = getattr(analysis, "transform", None)
        if transform is not None and transform.eta is not None and len(transform.eta) != shape.size:
            self.add(
                "transform.eta",
                f"the alternative has {len(transform.eta)} values but the answer has "
                f"{shape.size} components ({len(shape.groups)} group(s) x "
                f"{', '.join(shape.components)})",
            )

    # ------------------------------------------------------------------------ model training

    def model_training(self, analysis: ModelTraining) -> None:
        from safeaccess.client.model_validation import model_problems

        target = self.column("target", analysis.target)
        if analysis.roc and target is not None:
            levels = declared_levels(target)
            if levels is not None and len(levels) != 2:
                self.add(
                    "roc",
                    f"a ROC curve needs a target with two classes, but {analysis.target!r} "
                    f"declares {len(levels)}; ask for roc=False or predict a two-level column",
                )
        for i, name in enumerate(analysis.features):
            self.column(f"features[{i}]", name)
        if analysis.fairness is not None:
            self.column("fairness.protected", analysis.fairness.protected)
        for field, message in model_problems(analysis, self.metadata):
            self.add(field, message)

    # ---------------------------------------------------------------------------- regression

    def regression(self, analysis: Regression) -> None:
        try:
            formula = parse_formula(analysis.formula)
        except GrammarError as exc:
            self.add("formula", str(exc))
            return
        self.formula(formula, analysis.family)

    def formula(self, formula: Formula, family: str) -> None:
        response = factor_column(formula.response)
        col = self.column("formula", response)
        if col is not None:
            self.response(col, formula, family)
        rhs: set[str] = set()
        for term in formula.terms:
            for f in term:
                name = factor_column(f)
                rhs.add(name)
                col = self.column("formula", name)
                if col is None or isinstance(f, Categorical):
                    continue
                if isinstance(f, Call | Power) and not is_numeric(col):
                    self.add(
                        "formula",
                        f"{factor_name(f)} transforms {name!r}, which is {col.type}; "
                        "transforms need a numeric column",
                    )
        if response in rhs:
            self.add("formula", f"the response {response!r} also appears on the right of '~'")

    def response(self, col: Column, formula: Formula, family: str) -> None:
        name = factor_name(formula.response)
        if not is_numeric(col):
            self.add(
                "formula",
                f"the response {name!r} must be numeric, but {col.name!r} is {col.type}"
                + (" with text levels; code it as 0/1" if col.levels else ""),
            )
            return
        if family in ("logit", "probit"):
            if not isinstance(formula.response, Var):
                self.add("formula", f"a {family} response must be a 0/1 column, not {name}")
            elif col.type == "continuous":
                self.add(
                    "formula",
                    f"a {family} model needs a binary 0/1 response, but {col.name!r} is continuous",
                )
            else:
                values = _declared_values(col)
                if values is not None and not values <= {0, 1}:
                    self.add(
                        "formula",
                        f"a {family} model needs a response coded 0/1, but {col.name!r} takes "
                        f"values {', '.join(f'{v:g}' for v in sorted(values))}",
                    )
        elif (
            family == "poisson"
            and isinstance(formula.response, Var)
            and col.bounds is not None
            and col.bounds[0] < 0
        ):
            self.add(
                "formula",
                f"a poisson model needs a count response, but {col.name!r} can be negative",
            )

    # -------------------------------------------------------------------------------- filter

    def where(self, text: str | None) -> Filter | None:
        if text is None:
            return None
        try:
            ast = parse_filter(text)
        except GrammarError as exc:
            self.add("where", str(exc))
            return None
        too_large = filter_size_problems(ast)
        for problem in too_large:
            self.add("where", problem)
        if too_large:
            return None
        self._filter(ast)
        return ast

    def _filter(self, node: Filter) -> None:
        if isinstance(node, Not):
            self._filter(node.operand)
            return
        if isinstance(node, And | Or):
            for operand in node.operands:
                self._filter(operand)
            return
        col = self.column("where", node.column)
        if col is None or isinstance(node, IsNull):
            return
        values: tuple[Scalar, ...]
        if isinstance(node, Compare):
            values = (node.value,)
        elif isinstance(node, In):
            values = node.values
        else:
            assert isinstance(node, Between)
            values = (node.low, node.high)
        for value in values:
            if not self._literal_type_ok(col, value):
                return
        equality = isinstance(node, In) or (isinstance(node, Compare) and node.op in ("==", "!="))
        if equality and col.levels is not None:
            unknown = [v for v in values if not _is_level(col, v)]
            if unknown:
                shown = ", ".join(repr(v) for v in unknown)
                self.add(
                    "where",
                    f"{shown} is not a level of {col.name!r}; its levels are "
                    f"{', '.join(repr(v) for v in col.levels)}",
                )

    def _literal_type_ok(self, col: Column, value: Scalar) -> bool:
        if col.type == "date":
            if not is_iso_date(value):
                self.add(
                    "where",
                    f"column {col.name!r} is a date but is compared with {value!r}; compare it "
                    "with a date written 'YYYY-MM-DD', e.g. '2020-01-31'",
                )
                return False
            return True
        numeric_col = is_numeric(col)
        if isinstance(value, str) and numeric_col:
            self.add(
                "where",
                f"column {col.name!r} is numeric ({col.type}) but is compared with the string "
                f"{value!r}; compare it with a number",
            )
            return False
        if not isinstance(value, str) and col.levels and not numeric_col:
            self.add(
                "where",
                f"column {col.name!r} has text levels but is compared with {value!r}; "
                f"quote the value, e.g. {str(col.levels[0])!r}",
            )
            return False
        return True


def is_iso_date(value: object) -> bool:
    """A quoted calendar date 'YYYY-MM-DD' (ten characters: compared as text, such dates
    order as the days do, which is how the runner's filters compare a date column)."""
    if not isinstance(value, str) or len(value) != 10:
        return False
    try:
        date.fromisoformat(value)
    except ValueError:
        return False
    return True


def _is_level(col: Column, value: Scalar) -> bool:
    levels = col.levels or []
    if isinstance(value, bool):
        return False
    return any(lvl == value for lvl in levels)


def _declared_values(col: Column) -> set[float] | None:
    """The values a column can take, if the metadata pins them down."""
    if col.levels is not None and _numeric_levels(col):
        return {float(v) for v in col.levels or [] if not isinstance(v, str)}
    if col.scale is not None:
        return {float(v) for v in range(col.scale[0], col.scale[1] + 1)}
    if col.type == "integer" and col.bounds is not None:
        lo, hi = col.bounds
        if hi - lo <= 100:
            return {float(v) for v in range(math.ceil(lo), math.floor(hi) + 1)}
    return None


def _levels_kept(where: Filter | None, column: str) -> set[Scalar] | None:
    """Values of `column` that a top-level `column in (...)` / `column = v` conjunct keeps."""
    if where is None:
        return None
    conjuncts = where.operands if isinstance(where, And) else (where,)
    for c in conjuncts:
        if isinstance(c, In) and c.column == column and not c.negated:
            return set(c.values)
        if isinstance(c, Compare) and c.column == column and c.op == "==":
            return {c.value}
    return None


__all__ = [
    "MAX_SCRIPT_BYTES",
    "AnalysisInvalid",
    "Problem",
    "check_grammar",
    "is_grouping",
    "is_numeric",
    "validate",
]
