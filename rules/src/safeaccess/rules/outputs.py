"""Typed outputs of analyses, as the sandbox runner produces them and the rules check them.

CONTRACT shared by the sandbox runner (producer), the rules engine (checker) and the server
(which releases `public()` and never the facts). Each output carries:

- the statistics that would be released to the researcher, and
- `facts`: what the disclosure checks need (cell counts, top contributions, residual degrees of
  freedom, query sets ...). Facts never leave the centre.

This package depends on nothing else of ours, so these models live here rather than in the
client's analysis language. New optional fields may be added with defaults; names are stable.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

Label = str | int | float | bool | None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def cell_dtype(n_labels: int) -> np.dtype[Any]:
    """The narrowest little-endian signed integer type that holds the cell indices of a query
    set with `n_labels` cells and -1 ("behind none"): int8 up to 127 cells, int16 up to 32 767,
    else int32. It depends only on the number of cells (the output's released labels), never
    on the records, so an array's size and the time to move it tell nothing about the data."""
    if n_labels <= 127:
        return np.dtype("i1")
    if n_labels <= 32_767:
        return np.dtype("<i2")
    return np.dtype("<i4")


class QuerySet(_Model):
    """The records behind each released aggregate of one output.

    The per-record array (one entry per record of the dataset version in stored order: the index
    of the released cell/group the record falls in, or -1 when the record is behind no released
    aggregate; in `cell_dtype(len(labels))`, int8 for up to 127 cells) never travels as JSON: at
    10 M records it is 10 MB even as int8. The runner sends it as binary side array number
    `array` of its reply (`sandbox.backend` `encode_reply` / `decode_reply`), and the decoded
    array is attached to this object again on the server. For an output with one aggregate
    (e.g. a regression) every included record has index 0.
    """

    labels: list[str] = Field(description="Human name of each cell/group index, in order.")
    array: int = Field(default=0, ge=0, description="Index of the side array in the reply.")
    weights: list[list[float]] | None = Field(
        default=None,
        description="Weighted rows (issue 41): when set, the output releases row j = "
        "sum_c weights[j][c] * (the records of cell c) for each j, not each cell's aggregate "
        "(a fit's design column over the value groups of a few-valued regressor). The floats "
        "the sandbox evaluated, admitted as the exact rationals they are.",
    )
    row_labels: list[str] | None = Field(
        default=None, description="The name of each weighted row (`weights`), in order."
    )
    _values: np.ndarray | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _weights_fit(self) -> QuerySet:
        if self.weights is not None:
            if not self.weights or any(len(row) != len(self.labels) for row in self.weights):
                raise ValueError("weighted rows need one weight per cell label")
            if self.row_labels is None or len(self.row_labels) != len(self.weights):
                raise ValueError("weighted rows need one row label each")
            if not all(math.isfinite(w) for row in self.weights for w in row):
                raise ValueError("a weight is not a finite number")
        return self

    @property
    def weighted(self) -> bool:
        return self.weights is not None

    @classmethod
    def from_array(cls, labels: list[str], index: np.ndarray) -> QuerySet:
        qs = cls(labels=labels)
        qs.attach(index)
        return qs

    def attach(self, index: np.ndarray) -> None:
        """Attach the per-record array (after it travelled on the side channel), in the
        query set's cell type. Raises ValueError for an index outside -1..len(labels)-1 that
        the narrower type could not hold (a narrowing cast must never wrap a cell to -1)."""
        target = cell_dtype(len(self.labels))
        values = np.asarray(index)
        if not np.issubdtype(values.dtype, np.integer):
            raise ValueError(f"a query set's array holds integers, got {values.dtype}")
        if values.dtype.itemsize > target.itemsize and values.size:
            low, high = int(values.min()), int(values.max())
            if low < -1 or high >= len(self.labels):
                raise ValueError(
                    f"query-set cell indices {low}..{high} outside -1..{len(self.labels) - 1}"
                )
        self._values = np.ascontiguousarray(values, dtype=target)

    @property
    def attached(self) -> bool:
        return self._values is not None

    def to_array(self) -> np.ndarray:
        """The per-record cell indices, in `cell_dtype(len(labels))`."""
        if self._values is None:
            raise ValueError("the query set's per-record array is not attached")
        return self._values


class MissingCount(_Model):
    """Records one released answer left out because a value it needs is missing.

    Released with the answer and checked like any count (`rules.missing`): a count below the
    threshold is shown as None with `suppressed` set, and the records behind each count travel
    in `facts.missing_query_sets` so that the query-set auditor sees them."""

    variables: list[str] = Field(description="The columns whose missing value left a record out.")
    group: list[Label] = Field(
        default_factory=list,
        description="The group or cell of the answer the records belong to; [] when the records "
        "fall in no group (a grouping variable is missing) or the answer is not grouped.",
    )
    count: int | None = Field(description="Records left out; None when suppressed.")
    suppressed: bool = Field(
        default=False, description="The count was below the threshold and is not shown."
    )

    @property
    def name(self) -> str:
        """The label of its records in the output's missing query set."""
        return missing_label(self.variables, self.group)


def missing_label(variables: list[str], group: list[Label]) -> str:
    """The query-set label of the records a missing count counts."""
    where = ", ".join("(missing)" if v is None else str(v) for v in group)
    return f"missing {' + '.join(variables)}" + (f" | {where}" if where else "")


MISSING_DESCRIPTION = (
    "Records left out of the answer because a value it needs is missing, per group where the "
    "answer is grouped (no value is imputed)."
)
MISSING_SETS_DESCRIPTION = (
    "The records behind each released missing count, one partition per list of variables "
    "(side arrays after the main query set and `extra_query_sets`)."
)


class CellFacts(_Model):
    """Per-cell facts for a table, in the same row-major layout as the table values."""

    counts: list[list[int]] = Field(description="Records in each cell.")
    contributors: list[list[int]] | None = Field(
        default=None,
        description="Distinct contributor units per cell, where the dataset declares a unit column.",
    )
    top: list[list[list[float]]] | None = Field(
        default=None,
        description="Largest contributions per cell (by contributor unit where declared), "
        "descending, at most 3; magnitude tables only.",
    )
    total: list[list[float]] | None = Field(
        default=None, description="Sum of contributions per cell; magnitude tables only."
    )
    negative: list[list[bool]] | None = Field(
        default=None, description="Cell has a negative contribution; magnitude tables only."
    )
    missing: list[list[int]] | None = Field(
        default=None, description="Records in the cell whose value was missing (magnitude tables)."
    )
    mode_count: list[list[int]] | None = Field(
        default=None, description="Records holding the released modal value; mode tables only."
    )
    deviation_top: list[list[list[float]]] | None = Field(
        default=None,
        description="Largest squared deviations from the cell mean (by contributor unit where "
        "declared), descending, at most 3; standard-deviation tables only.",
    )
    deviation_total: list[list[float]] | None = Field(
        default=None, description="Sum of squared deviations per cell; std tables only."
    )


class TableFacts(_Model):
    cells: CellFacts
    query_set: QuerySet | None = None
    n_total: int
    bin_edges_from_data: bool | None = Field(
        default=None,
        description="Histograms only: True when the bin edges were derived from the data (e.g. "
        "a bin count spread between the observed minimum and maximum, so the outer edges are raw "
        "extremes); False when the researcher declared the edges; None when unknown.",
    )
    missing_query_sets: list[QuerySet] = Field(
        default_factory=list, description=MISSING_SETS_DESCRIPTION
    )


class TableOutput(_Model):
    """A cross-tabulation: frequency table, magnitude table (sum/mean) or histogram.

    `values[i][j]` is the statistic in row i, column j (None if empty/suppressed). Row and column
    labels are tuples of the levels of the row / column variables. A one-way table has a single
    column whose label is []. When margins are requested, the last row / column is the total and
    its label is ["All"].
    """

    type: Literal["table"] = "table"
    source: Literal["frequency_table", "magnitude_table", "histogram", "contingency"]
    statistic: Literal["count", "sum", "mean", "std", "mode"]
    value: str | None = None
    row_vars: list[str]
    col_vars: list[str]
    row_labels: list[list[Label]]
    col_labels: list[list[Label]]
    values: list[list[float | None]]
    margins: bool = False
    bin_edges: list[float] | None = Field(default=None, description="Histograms only.")
    suppressed: list[list[bool]] | None = None
    rounded_to: int | None = None
    missing: list[MissingCount] = Field(default_factory=list, description=MISSING_DESCRIPTION)
    facts: TableFacts


class VariableSummary(_Model):
    variable: str
    n: int | None = Field(
        description="The group's records with a value of the variable; None when `n_suppressed`."
    )
    n_suppressed: bool = Field(
        default=False,
        description="n (and the count statistic) are suppressed together with the group's "
        "missing count, which the group's size less n would give back (issue 41).",
    )
    stats: dict[str, float | None] = Field(
        description="Statistic name -> value; quantiles as 'q0.25' etc."
    )


class SummaryGroup(_Model):
    labels: list[Label] = Field(description="Levels of the `by` variables; [] when ungrouped.")
    variables: list[VariableSummary]


class SpreadFacts(_Model):
    """How concentrated one central moment is: the largest records' shares of sum |y - mean|^r.

    A released sd/variance (r = 2), skewness (r = 3) or kurtosis (r = 4) is a magnitude over
    the records' deviations; when one or two records hold nearly all of it, the statistic
    tells their deviation (the spread analogue of N-K dominance on a total)."""

    power: int = Field(ge=2, le=4, description="r: 2 for sd/var, 3 skewness, 4 kurtosis.")
    top: list[float] = Field(
        description="Largest |y - mean|^r (summed per contributor unit where declared), "
        "descending, at most 3."
    )
    total: float = Field(ge=0.0, description="Sum of |y - mean|^r over the group.")


class BoundClass(_Model):
    """Records of a group whose value the `where` filter confines to the same interval.

    For each record the runner finds every value of the summarised variable for which the
    filter would still hold with the record's other columns unchanged; the hull of those
    values, cut to the declared bounds, is what the filter tells about the record. None: no
    bound on that side."""

    low: float | None
    high: float | None
    count: int = Field(ge=1)
    part: tuple[float | None, float | None] | None = Field(
        default=None,
        description="Where the filter allows separate intervals, the (low, high) of the one "
        "that holds these records' own values: the check credits the other records with "
        "knowing it, which only narrows what it derives (None: the same as low and high).",
    )


class TransformStep(_Model):
    """One step of the transform a model's formula applies to its outcome column, innermost
    first (`log(income)`: one step `log`; `I(sqrt(income) ** 2)`: `sqrt`, then `power` 2)."""

    func: Literal["log", "log1p", "exp", "sqrt", "abs", "power"]
    exponent: int | None = Field(default=None, ge=2, le=10, description="For `power` only.")


class SummaryVariableFacts(_Model):
    n: int
    n_distinct: int
    scale: tuple[int, int] | None = Field(
        default=None,
        description="(lowest, highest) for ordinal / small-integer variables (reconstruction risk).",
    )
    value_counts: dict[str, int] | None = Field(
        default=None, description="Frequencies of each value, for discrete variables with scale."
    )
    mode_share: float | None = Field(default=None, description="Share of records at the mode.")
    variance_zero: bool = False
    n_at_min: int | None = Field(
        default=None,
        description="Records holding the minimum value (a minimum shared by many records, e.g. a "
        "bottom-coded value, is not one person's value).",
    )
    n_at_max: int | None = Field(default=None, description="Records holding the maximum value.")
    contributors: int | None = Field(
        default=None,
        description="Distinct contributor units behind the statistic, where the dataset declares a "
        "unit column.",
    )
    top: list[float] | None = Field(
        default=None,
        description="Largest contributions to the variable's total (by contributor unit where "
        "declared), descending, at most 3; for dominance checks on means and totals.",
    )
    total: float | None = Field(default=None, description="Sum of the variable's values.")
    negative: bool | None = Field(
        default=None, description="Some value is negative (dominance rules are then undefined)."
    )
    missing: int | None = Field(
        default=None, description="Records of the group whose value was missing and was ignored."
    )
    spread: list[SpreadFacts] | None = Field(
        default=None, description="Concentration of the central moments (None: not recorded)."
    )
    bounds: list[BoundClass] | None = Field(
        default=None,
        description="What the filter and the declared bounds confine each record's value to, "
        "by class of equal intervals (None: not recorded).",
    )
    transform: list[TransformStep] | None = Field(
        default=None,
        description="A model's transformed outcome (`log(income) ~ ...`): the values are the "
        "transform of the column, `bounds` are on the column's own scale (None: untransformed).",
    )
    quantile_window: int | None = Field(
        default=None,
        description="Order statistics averaged into each released quantile, median and iqr "
        "end (None: not recorded).",
    )


class SummaryGroupFacts(_Model):
    labels: list[Label]
    n: int
    variables: dict[str, SummaryVariableFacts]


class SummaryFacts(_Model):
    groups: list[SummaryGroupFacts]
    query_set: QuerySet | None = Field(
        default=None,
        description="Per group, the records with a value of the first variable (its n and "
        "statistics are over them); the group's whole records where that n is suppressed.",
    )
    extra_query_sets: list[QuerySet] = Field(
        default_factory=list,
        description="The same for each further variable, in order (one set per variable).",
    )
    n_total: int
    missing_query_sets: list[QuerySet] = Field(
        default_factory=list, description=MISSING_SETS_DESCRIPTION
    )


class SummaryOutput(_Model):
    type: Literal["summary"] = "summary"
    by: list[str]
    statistics: list[str]
    quantile_type: int = 7
    round: int | None = None
    groups: list[SummaryGroup]
    missing: list[MissingCount] = Field(default_factory=list, description=MISSING_DESCRIPTION)
    facts: SummaryFacts


class Coefficient(_Model):
    term: str
    estimate: float
    std_error: float | None
    statistic: float | None
    p_value: float | None
    ci_low: float | None
    ci_high: float | None


class RegressorFacts(_Model):
    term: str
    binary: bool
    ones: int | None = Field(default=None, description="Records with value 1, for binary terms.")
    zeros: int | None = None


class LeverageFacts(_Model):
    """The largest leverages (hat values) of the records behind a model, never which records.

    A record with leverage near 1 is fitted almost exactly, so its response can be read back
    from the released estimates. For GLMs the hat values are taken at the fitted IRLS weights;
    for correlations, over the simple regressions each pair of variables gives (both ways); for
    a two-sample test, of the regression on the group indicator (1/n per group of n).
    """

    n: int = Field(description="Records the model was fitted on.")
    max: float = Field(description="The largest hat value (0 when there are no records).")
    top: list[float] = Field(
        default_factory=list,
        description="The largest hat values, descending (at most 50): how many records exceed a "
        "limit, counted without saying which.",
    )

    def count_over(self, limit: float) -> tuple[int, bool]:
        """(records with leverage above `limit`, whether that count may be higher: the list is
        capped and every value in it is over the limit)."""
        over = sum(1 for h in self.top if h > limit)
        return over, over == len(self.top) and over < self.n


class RegressionFacts(_Model):
    n: int
    df_resid: float
    df_model: float
    categorical_only: bool = Field(description="All regressors are categorical (dummy) terms.")
    saturated: bool = Field(description="Parameters equal the number of distinct covariate cells.")
    regressors: list[RegressorFacts]
    query_set: QuerySet | None = None
    extra_query_sets: list[QuerySet] = Field(
        default_factory=list,
        description="The sub-groups whose totals the fit releases, each a partition of the "
        "model's records: the records with each dummy or interaction column 1 (and 0), and the "
        "level sets of numeric columns with few distinct values (side arrays 1, 2, ...).",
    )
    leverage: LeverageFacts | None = Field(
        default=None, description="Hat values of the fitted model (None: not computed)."
    )
    residual_spread: SpreadFacts | None = Field(
        default=None,
        description="OLS: the largest squared residuals and their sum, which the released "
        "standard errors and fit statistics are computed from (None: not recorded).",
    )
    outcome: SummaryVariableFacts | None = Field(
        default=None,
        description="The outcome over the model's records, as a summary records it (count, "
        "total, largest values, spread, the filter's bounds, small-integer scale): the fit "
        "releases its mean (every family) and its sd (OLS), which must meet the summary rules "
        "(None: not recorded; the model then goes to review).",
    )
    missing_query_sets: list[QuerySet] = Field(
        default_factory=list, description=MISSING_SETS_DESCRIPTION
    )


class RegressionOutput(_Model):
    type: Literal["regression"] = "regression"
    family: Literal["ols", "logit", "probit", "poisson"]
    formula: str
    n: int
    df_resid: float
    df_model: float
    coefficients: list[Coefficient]
    fit: dict[str, float | None] = Field(
        default_factory=dict, description="r2, adj_r2, aic, bic, llf, pseudo_r2 ... as applicable."
    )
    fit_withheld: list[str] = Field(
        default_factory=list,
        description="Fit statistics statsmodels gives that this centre does not release for the "
        "family (a Poisson fit's llf, llnull, aic, bic and pseudo_r2 carry sum log(y!), which no "
        "output rule can check; the likelihood-ratio statistic llr, free of it, is released).",
    )
    missing: list[MissingCount] = Field(default_factory=list, description=MISSING_DESCRIPTION)
    facts: RegressionFacts


class CorrelationFacts(_Model):
    n: int
    binary: list[str] = Field(description="Variables with exactly two distinct values.")
    pair_tables: dict[str, list[list[int]]] = Field(
        default_factory=dict,
        description="For each binary-by-binary pair 'a|b', its 2x2 count table.",
    )
    query_set: QuerySet | None = None
    leverage: LeverageFacts | None = Field(
        default=None,
        description="Hat values of the simple regressions the correlations contain, each pair "
        "both ways (None: not computed).",
    )
    missing_query_sets: list[QuerySet] = Field(
        default_factory=list, description=MISSING_SETS_DESCRIPTION
    )


class CorrelationOutput(_Model):
    type: Literal["correlation"] = "correlation"
    method: Literal["pearson", "spearman"]
    variables: list[str]
    matrix: list[list[float | None]]
    n: int
    missing: list[MissingCount] = Field(default_factory=list, description=MISSING_DESCRIPTION)
    facts: CorrelationFacts


class TestFacts(_Model):
    n: int
    group_counts: dict[str, int] = Field(default_factory=dict)
    table: list[list[int]] | None = Field(default=None, description="chi2 contingency counts.")
    query_set: QuerySet | None = None
    leverage: LeverageFacts | None = Field(
        default=None,
        description="t tests: hat values of the regression on the group indicator (None: not "
        "computed, or a chi-square test).",
    )
    missing_query_sets: list[QuerySet] = Field(
        default_factory=list, description=MISSING_SETS_DESCRIPTION
    )


class TestOutput(_Model):
    type: Literal["test"] = "test"
    test: Literal["chi2_independence", "t_two_sample"]
    statistic: float
    df: float
    p_value: float
    n: int
    details: dict[str, float | None] = Field(
        default_factory=dict, description="e.g. group means for a t test."
    )
    missing: list[MissingCount] = Field(default_factory=list, description=MISSING_DESCRIPTION)
    facts: TestFacts


class SurvivalStep(_Model):
    """One step of a Kaplan-Meier curve: the estimate just after `time`."""

    time: float
    at_risk: int
    events: int
    censored: int = 0
    survival: float
    std_error: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None


class SurvivalCurve(_Model):
    labels: list[Label] = Field(description="Levels of the `by` variables; [] when ungrouped.")
    steps: list[SurvivalStep]


class SurvivalStepFacts(_Model):
    """What the checks need about one step: the records at risk and the events at that time."""

    time: float
    at_risk: int
    events: int
    censored: int = 0


class SurvivalCurveFacts(_Model):
    labels: list[Label]
    steps: list[SurvivalStepFacts]


class SurvivalFacts(_Model):
    curves: list[SurvivalCurveFacts]
    query_set: QuerySet | None = None
    n_total: int
    missing_query_sets: list[QuerySet] = Field(
        default_factory=list, description=MISSING_SETS_DESCRIPTION
    )


class SurvivalOutput(_Model):
    """A survival table (Kaplan-Meier): per step the number at risk, events and the estimate."""

    type: Literal["survival"] = "survival"
    time: str
    event: str
    by: list[str] = Field(default_factory=list)
    curves: list[SurvivalCurve]
    missing: list[MissingCount] = Field(default_factory=list, description=MISSING_DESCRIPTION)
    facts: SurvivalFacts


class ScriptFacts(_Model):
    stdout_bytes: int


class ScriptOutput(_Model):
    """Output of a `script` analysis: always sent to human review, never auto-released."""

    type: Literal["script"] = "script"
    stdout: str
    result: Any = Field(default=None, description="JSON value the script assigned to `result`.")
    facts: ScriptFacts


DPKind = Literal["dp_count", "dp_sum", "dp_mean", "dp_histogram", "dp_mean_test"]


class DPStatisticFacts(_Model):
    values: list[list[float]] = Field(
        description="The exact statistic, groups x components, values clipped to the declared "
        "bounds. Never released: the server releases a noisy DPAnswerOutput instead."
    )
    second_moments: list[list[list[float]]] | None = Field(
        default=None,
        description="dp_mean_test only: per group, the sums of products of the centred, clipped "
        "variables (a k x k matrix), for the covariance step of the DP Hotelling test.",
    )
    n_total: int


class DPStatisticOutput(_Model):
    """What the sandbox computes for a differentially private kind: the exact statistic over
    every declared group. It never leaves the centre; the server adds the noise."""

    type: Literal["dp_statistic"] = "dp_statistic"
    kind: DPKind
    by: list[str]
    groups: list[list[Label]]
    components: list[str]
    facts: DPStatisticFacts


class DPRisk(_Model):
    """What an attacker deciding between neighbouring datasets achieves against one release."""

    tpr_at_fpr: dict[str, float] = Field(description="FPR ('0.01', '0.05', '0.1') -> best TPR.")
    auc: float
    auc_two_releases: float | None = None


class DPLedgerView(_Model):
    scope: Literal["researcher", "project", "dataset"]
    epsilon_budget: float
    delta: float
    epsilon_spent: float
    mu_spent: float
    mu_remaining: float
    releases: int


class DPAnswerFacts(_Model):
    records_per_unit: int
    charge: float = Field(description="(Delta/sigma)^2 added to the ledger.")
    noise: Literal["opendp_gaussian"] = "opendp_gaussian"


class DPAnswerOutput(_Model):
    """A released differentially private answer: noisy values with what inference needs.

    `values[g]` is the noisy answer of group `groups[g]` in the order of `components`. With a
    transformation, `values` are of the transformed query `Diag(weights)^(1/2) f + N(0, sigma^2 I)`
    and `weights` are the xi the client divides out.
    """

    type: Literal["dp_answer"] = "dp_answer"
    kind: DPKind
    by: list[str]
    groups: list[list[Label]]
    components: list[str]
    values: list[list[float]]
    sigma: float
    sensitivity: float
    epsilon: float | None = Field(default=None, description="Requested epsilon, if any.")
    delta: float | None = None
    centres: list[float] = Field(default_factory=list, description="dp_mean: midpoints c_v.")
    weights: list[float] | None = None
    noise_sd: list[list[float | None]] | None = Field(
        default=None,
        description="Per group and component: the standard deviation of the noise in that "
        "component's estimate (sigma / sqrt(weight); the mean test's own sigma per statistic; "
        "None where a test transformation gave the component no weight).",
    )
    transform: dict[str, Any] | None = None
    test: dict[str, Any] | None = Field(default=None, description="dp_mean_test's result.")
    risk: DPRisk
    ledger: DPLedgerView
    facts: DPAnswerFacts


class ModelTree(_Model):
    """One tree of a released model, as parallel arrays over its nodes (node 0 is the root).

    Internal node i sends a record to `left[i]` when its encoded feature `feature[i]` is at most
    `threshold[i]`, else to `right[i]`. A leaf has `left[i] == right[i] == -1`; its prediction is
    `value[i]`: class probabilities for classification trees, one raw score per output for the
    regression trees of gradient boosting. `counts[i]` holds, for a leaf of a classification tree,
    the training records of each class that reached it (None for internal nodes and for
    boosting, whose leaves carry scores).
    """

    feature: list[int]
    threshold: list[float]
    left: list[int]
    right: list[int]
    value: list[list[float]]
    counts: list[list[int] | None] | None = None


class EncodedFeature(_Model):
    """How one analysis feature becomes columns of the model's input matrix.

    A numeric feature is one column holding its value. A categorical feature becomes one 0/1
    column per level declared in the dataset metadata (never levels seen in the data); a value
    that is not a declared level gives zeros in all of them."""

    name: str
    kind: Literal["numeric", "categorical"]
    levels: list[Label] = Field(default_factory=list)
    columns: list[str] = Field(description="Names of the encoded columns, in matrix order.")


class ModelSpec(_Model):
    """The fitted model itself: enough to predict, nothing about individual records.

    - decision_tree: `trees` holds one tree (probabilities at the leaves).
    - random_forest: `trees` holds every tree; predict_proba is their mean.
    - gradient_boosting: `trees` holds the regression trees stage by stage, `per_stage` trees per
      stage (1 for two classes, one per class otherwise); the raw score is `init` plus
      `learning_rate` times the sum of the reached leaves' values; probabilities are the
      logistic (two classes) or softmax (more) of it.
    - logistic_regression: `coefficients[k]` over the encoded columns and `intercept[k]`, one row
      for two classes (the score of the second class) or one per class (softmax).
    """

    family: Literal["decision_tree", "random_forest", "gradient_boosting", "logistic_regression"]
    trees: list[ModelTree] = Field(default_factory=list)
    per_stage: int = 1
    init: list[float] = Field(default_factory=list)
    learning_rate: float | None = None
    coefficients: list[list[float]] = Field(default_factory=list)
    intercept: list[float] = Field(default_factory=list)
    fitted_classes: list[int] = Field(
        default_factory=list,
        description="Indexes (into the output's classes) of the classes the model was fitted "
        "on, in the order of its scores; a declared class absent from training gets probability 0.",
    )


class ThresholdRule(_Model):
    """fairlearn's post-processing for one group: with probability `p0` predict by rule 0, else
    by rule 1; a rule predicts the positive class when the score is above (`>`) or below (`<`)
    its threshold."""

    p0: float
    operator0: Literal[">", "<"]
    threshold0: float
    p1: float
    operator1: Literal[">", "<"]
    threshold1: float


class FairnessPredictor(_Model):
    """What a fairness treatment adds to the prediction rule.

    - exponentiated_gradient: a randomised classifier: each of `ensemble`'s models votes its
      predicted class with weight `weights[i]`; the vote shares are the probabilities.
    - threshold_optimizer: the base model's probability of the positive class is compared with
      the group's `rules` (keyed by the protected attribute's level); needs the protected
      attribute at prediction time.
    """

    treatment: Literal["exponentiated_gradient", "threshold_optimizer"]
    protected: str
    weights: list[float] = Field(default_factory=list)
    ensemble: list[ModelSpec] = Field(default_factory=list)
    rules: dict[str, ThresholdRule] = Field(default_factory=dict)


class FairnessGroup(_Model):
    level: Label
    selection_rate: float | None = Field(
        default=None, description="None when the group's test records are below the threshold."
    )


class FairnessReport(_Model):
    """Fairness on the test split with respect to the protected attribute (positive class =
    the second declared level of the target)."""

    protected: str
    treatment: str
    constraint: str
    demographic_parity_difference: float | None
    equalized_odds_difference: float | None
    groups: list[FairnessGroup]
    groups_left_out: int = Field(
        default=0,
        description="Groups with fewer test records than the threshold: no rate is released for "
        "them and the differences are taken over the other groups.",
    )


class TreeLeafFacts(_Model):
    """Training records at each leaf of one tree, by class (classification trees) or in total
    (boosting), in leaf order."""

    counts: list[list[int]]


class MembershipFacts(_Model):
    """Membership-inference attacks the runner ran on the real training and test records."""

    n_train: int
    n_test: int
    loss_auc: float = Field(
        description="AUC of the per-record loss telling training from test records (0.5: no "
        "better than guessing)."
    )
    loss_auc_p_value: float | None = None
    worst_case_auc: float = Field(
        description="Mean cross-validated AUC of an attack classifier trained on the sorted "
        "predicted probabilities of training vs test records (SACRO-ML's worst-case attack)."
    )
    worst_case_auc_max: float | None = None
    worst_case_reps: int = 0
    train_accuracy: float | None = None
    test_accuracy: float | None = None


class FairnessFacts(_Model):
    """Per protected group on the test split: records and confusion counts (n, positives,
    predicted_positive, true_positive, false_positive). The released report is computed from
    these over the groups with at least `threshold` test records."""

    group_test_counts: dict[str, int]
    group_train_counts: dict[str, int] = Field(default_factory=dict)
    group_confusion: dict[str, dict[str, int]] = Field(default_factory=dict)
    all_groups_demographic_parity_difference: float | None = None
    all_groups_equalized_odds_difference: float | None = None


class RocPoint(_Model):
    """One point of a released ROC curve: rates only (the score thresholds are test records'
    predicted probabilities and are never released)."""

    fpr: float
    tpr: float


class RocStep(_Model):
    """The records one step of a released ROC curve adds, between two released points."""

    true_positives: int
    false_positives: int


class ModelFacts(_Model):
    family: str
    n_train: int
    n_test: int
    leaves: list[TreeLeafFacts] = Field(
        default_factory=list, description="One entry per tree, leaves in tree order."
    )
    class_counts_train: list[int] = Field(
        default_factory=list, description="Training records of each declared class."
    )
    class_counts_test: list[int] = Field(
        default_factory=list, description="Test records of each declared class."
    )
    depth: int | None = Field(default=None, description="Largest depth of any tree.")
    n_leaves: int | None = Field(default=None, description="Most leaves of any tree.")
    features_used: list[str] = Field(
        default_factory=list, description="Analysis features the fitted model actually uses."
    )
    n_parameters: int | None = Field(
        default=None, description="Logistic regression: fitted coefficients and intercepts."
    )
    df_resid: float | None = Field(
        default=None, description="Logistic regression: training records minus parameters."
    )
    leverage: LeverageFacts | None = None
    embeds_records: bool = Field(
        default=False,
        description="The model stores training records (k-NN, SVM support vectors): never "
        "released. Always False for the families the runner trains.",
    )
    membership: MembershipFacts | None = None
    fairness: FairnessFacts | None = None
    roc_steps: list[RocStep] | None = Field(
        default=None, description="Per step of the released ROC curve, the records it adds."
    )
    query_set: QuerySet | None = Field(
        default=None,
        description="Tree 0's leaves for the training records (logistic regression: one cell), "
        "then the test records, one cell per protected group when a fairness report is given.",
    )
    extra_query_sets: list[QuerySet] = Field(
        default_factory=list,
        description="The leaves of each further tree of a forest or boosting (side arrays "
        "1, 2, ...).",
    )
    missing_query_sets: list[QuerySet] = Field(
        default_factory=list, description=MISSING_SETS_DESCRIPTION
    )


class ModelOutput(_Model):
    """A trained classifier: its JSON description (never a pickle) and its test metrics."""

    type: Literal["model"] = "model"
    family: Literal["decision_tree", "random_forest", "gradient_boosting", "logistic_regression"]
    target: str
    classes: list[Label] = Field(description="The target's declared levels, in order.")
    features: list[EncodedFeature]
    model: ModelSpec
    fairness_predictor: FairnessPredictor | None = None
    metrics: dict[str, float | None] = Field(
        description="Test-split metrics: accuracy, balanced_accuracy, roc_auc (two classes)."
    )
    n_train: int
    n_test: int
    split: dict[str, Any] = Field(
        default_factory=dict, description="How the train/test split was drawn (seed, fraction)."
    )
    fairness: FairnessReport | None = None
    roc: list[RocPoint] | None = Field(
        default=None,
        description="ROC curve on the test split from (0, 0) to (1, 1), when asked for "
        "(two classes): each step adds at least threshold true and false positives.",
    )
    missing: list[MissingCount] = Field(default_factory=list, description=MISSING_DESCRIPTION)
    facts: ModelFacts


class SynthTablesFacts(_Model):
    tables: list[list[float]] = Field(
        description="Exact counts of the workload's tables (one-ways, pairs, cliques; flat, C "
        "order over the clique's columns). Never released: the server adds the noise."
    )


class SynthTablesOutput(_Model):
    """What the sandbox computes for `synthetic_data`: exact count tables over declared codes."""

    type: Literal["synth_tables"] = "synth_tables"
    columns: list[str]
    facts: SynthTablesFacts


class SynthCheckFacts(_Model):
    verdict: Literal["release", "review", "withhold"]
    outcomes: list[dict[str, str]] = Field(description="Every synth_* rule that fired.")
    checks: dict[str, Any] = Field(description="The check numbers (real data: checkers only).")
    error: str | None = None


class SynthCheckOutput(_Model):
    """The disclosure check of synthetic records against the real ones (sandbox job 2)."""

    type: Literal["synth_check"] = "synth_check"
    facts: SynthCheckFacts


class SynthFile(_Model):
    format: Literal["parquet"] = "parquet"
    sha256: str
    rows: int
    bytes: int


class SynthColumnView(_Model):
    name: str
    type: str
    levels: list[Label] | None = None
    bins: list[float] | None = None
    #: A date column's bin edges as 'YYYY-MM-DD' (bins [edge, next), the last holds its end);
    #: `bins` holds the same edges as day numbers (proleptic ordinals), as they are coded.
    date_bins: list[str] | None = None
    nullable: bool


class SynthMeasurement(_Model):
    """A released noisy marginal: C-order cells over `clique`, each with noise sd `sigma`."""

    clique: list[str]
    values: list[float]
    sigma: float


class SynthPrivacy(_Model):
    mu: float
    epsilon: float
    delta: float
    method: Literal["mst", "fixed"]
    sigma_oneway: float
    sigma_selection: float | None
    sigma_cliques: float
    noisy_scores: list[float] | None = Field(
        default=None, description="mst: the Gaussian-noised pair scores the tree came from."
    )
    tree: list[list[str]]
    cliques: list[list[str]]
    noisy_total: float
    noisy_total_sd: float
    risk: DPRisk
    ledger: DPLedgerView


class SynthUtility(_Model):
    """Fit of the synthetic records to the released noisy marginals (released quantities only)."""

    clique: list[str]
    tvd: float
    expected_noise_tvd: float


class SynthReleaseFacts(_Model):
    records_per_unit: int
    charge: float
    check: SynthCheckFacts


class SyntheticDataOutput(_Model):
    """Released synthetic data: the Parquet file's hash, the DP release and its reports."""

    type: Literal["synthetic_data"] = "synthetic_data"
    file: SynthFile
    columns: list[SynthColumnView]
    privacy: SynthPrivacy
    measurements: list[SynthMeasurement]
    utility: list[SynthUtility]
    checks: dict[str, str] = Field(description="'passed', the rule set and its hash: no numbers.")
    facts: SynthReleaseFacts


Output = Annotated[
    TableOutput
    | SummaryOutput
    | RegressionOutput
    | CorrelationOutput
    | TestOutput
    | SurvivalOutput
    | ScriptOutput
    | DPStatisticOutput
    | DPAnswerOutput
    | ModelOutput
    | SynthTablesOutput
    | SynthCheckOutput
    | SyntheticDataOutput,
    Field(discriminator="type"),
]


def query_set_of(output: BaseModel) -> QuerySet | None:
    """The output's query set, if its kind has one."""
    found = getattr(getattr(output, "facts", None), "query_set", None)
    return found if isinstance(found, QuerySet) else None


#: The start of a weighted row's label (`QuerySet.row_labels`): a row the domain grid never
#: evaluates as a set of records (`server/qss/grid.py`).
WEIGHTED_LABEL = "weighted: "


def extra_query_sets_of(output: BaseModel) -> list[QuerySet]:
    """Further query sets of an output that has several partitions of its records (the trees
    of a forest), travelling as side arrays 1, 2, ... after the main query set."""
    facts = getattr(output, "facts", None)
    out: list[QuerySet] = []
    # The records behind the missing counts come last (`MissingCount`).
    for name in ("extra_query_sets", "missing_query_sets"):
        found = getattr(facts, name, None)
        if isinstance(found, list):
            out += [q for q in found if isinstance(q, QuerySet)]
    return out


def public(output: BaseModel) -> dict[str, Any]:
    """What may leave the centre once released: the output without its facts."""
    return output.model_dump(mode="json", exclude={"facts"})
