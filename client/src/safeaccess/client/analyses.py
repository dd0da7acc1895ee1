"""The analysis language: one pydantic model per analysis kind, a discriminated union on `kind`.

An analysis is declarative so that the server knows what each output is and which disclosure
checks apply. Bodies are serialised as canonical JSON (RFC 8785) and bound into the sequence.
`where` filters and regression formulas are strings in our own grammar (see `grammar.py`); they
are parsed, never evaluated as code.

CONTRACT (shared by client, sandbox runner, rules and server): field names below are stable.
New optional fields may be added with defaults.
"""

from __future__ import annotations

import itertools
import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from safeaccess.client.protocol import canonical

SummaryStatistic = Literal[
    "count",
    "mean",
    "sd",
    "var",
    "median",
    "quantiles",
    "min",
    "max",
    "mode",
    "skewness",
    "kurtosis",
    "iqr",
]


def _default_statistics() -> list[SummaryStatistic]:
    return ["count", "mean", "sd"]


class _Analysis(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    where: str | None = Field(
        default=None, description="Row filter in the safeaccess filter grammar, e.g. 'age >= 18'."
    )


class Mitigations(BaseModel):
    """Mitigations a researcher asks for inside the analysis, so they are bound in the sequence."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    round_to: int | None = Field(
        default=None, ge=1, description="Round released counts/values to a multiple of this base."
    )
    suppress: bool = Field(
        default=False,
        description="Suppress unsafe cells (and recompute margins) instead of withholding the table.",
    )


class FrequencyTable(_Analysis):
    kind: Literal["frequency_table"] = "frequency_table"
    rows: list[str] = Field(min_length=1)
    cols: list[str] = Field(default_factory=list)
    margins: bool = False
    mitigations: Mitigations = Field(default_factory=Mitigations)


class MagnitudeTable(_Analysis):
    kind: Literal["magnitude_table"] = "magnitude_table"
    value: str
    agg: Literal["sum", "mean", "std", "mode"] = Field(
        default="sum",
        description="Per cell: the total, the mean, the sample standard deviation (ddof 1) or "
        "the most frequent value (ties go to the smallest).",
    )
    rows: list[str] = Field(min_length=1)
    cols: list[str] = Field(default_factory=list)
    margins: bool = False
    mitigations: Mitigations = Field(default_factory=Mitigations)


# Most quantiles one summary may ask for: every 5 %. Many quantiles of one group outline its
# sorted values; the rule set's `max_quantiles` (same default) may lower it per dataset.
MAX_QUANTILES = 19


class Summary(_Analysis):
    kind: Literal["summary"] = "summary"
    variables: list[str] = Field(min_length=1)
    statistics: list[SummaryStatistic] = Field(default_factory=_default_statistics)
    quantiles: list[float] = Field(
        default_factory=list,
        description="Probabilities in (0, 1), used when 'quantiles' is asked; at most 19.",
    )
    quantile_type: Literal[1, 2, 3, 4, 5, 6, 7, 8, 9] = Field(
        default=7,
        description="Hyndman-Fan position of each quantile (7 = R default, 6 = SPSS, 2 = SAS); the "
        "released value is the mean of the 10 order statistics nearest that position.",
    )
    by: list[str] = Field(default_factory=list)
    round: int | None = Field(default=None, ge=0, le=12, description="Decimals to round to.")

    @model_validator(mode="after")
    def _quantiles_valid(self) -> Summary:
        for p in self.quantiles:
            if not 0.0 < p < 1.0:
                raise ValueError(f"quantile probability {p} must lie strictly between 0 and 1")
        if len(self.quantiles) > MAX_QUANTILES:
            raise ValueError(
                f"a summary may ask for at most {MAX_QUANTILES} quantiles (every 5 %), got "
                f"{len(self.quantiles)}; split them over fewer, coarser probabilities"
            )
        if "quantiles" in self.statistics and not self.quantiles:
            raise ValueError("statistic 'quantiles' needs a list of probabilities in 'quantiles'")
        if self.quantiles and "quantiles" not in self.statistics:
            # Honoured only through the statistic: refused rather than sealed and ignored.
            raise ValueError(
                "field 'quantiles' is given but 'statistics' does not ask for them: add "
                "'quantiles' to 'statistics' or leave 'quantiles' out"
            )
        if self.quantile_type != 7 and not ({"quantiles", "iqr"} & set(self.statistics)):
            raise ValueError(
                "field 'quantile_type' is given but no statistic uses it (the median is the "
                "middle window whatever the type): ask for 'quantiles' or 'iqr', or leave "
                "'quantile_type' out"
            )
        return self


class Regression(_Analysis):
    kind: Literal["regression"] = "regression"
    family: Literal["ols", "logit", "probit", "poisson"] = "ols"
    formula: str = Field(description="Model formula, e.g. 'income ~ age + C(sex)'.")


class Correlation(_Analysis):
    kind: Literal["correlation"] = "correlation"
    method: Literal["pearson", "spearman"] = "pearson"
    variables: list[str] = Field(min_length=2)


class Histogram(_Analysis):
    kind: Literal["histogram"] = "histogram"
    variable: str
    bins: int | None = Field(default=None, ge=1, le=1000)
    edges: list[float] | None = None
    by: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _bins_or_edges(self) -> Histogram:
        if (self.bins is None) == (self.edges is None):
            raise ValueError("give exactly one of 'bins' (a count) or 'edges' (bin boundaries)")
        if self.edges is not None:
            if len(self.edges) < 2:
                raise ValueError("'edges' needs at least two boundaries")
            if any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
                raise ValueError("'edges' must be strictly increasing")
        return self


class StatTest(_Analysis):
    kind: Literal["test"] = "test"
    test: Literal["chi2_independence", "t_two_sample"]
    # chi2_independence: rows x cols contingency table
    rows: str | None = None
    cols: str | None = None
    # t_two_sample: numeric `variable` compared across the two levels of `group`
    variable: str | None = None
    group: str | None = None
    equal_var: bool = False

    @model_validator(mode="after")
    def _fields_for_test(self) -> StatTest:
        if self.test == "chi2_independence" and not (self.rows and self.cols):
            raise ValueError("chi2_independence needs 'rows' and 'cols'")
        if self.test == "t_two_sample" and not (self.variable and self.group):
            raise ValueError("t_two_sample needs 'variable' and 'group'")
        # A field of the other test would be sealed and ignored: refuse it by name.
        unused = (
            ["variable", "group", "equal_var"]
            if self.test == "chi2_independence"
            else ["rows", "cols"]
        )
        for name in unused:
            if name in self.model_fields_set and getattr(self, name) not in (None, False):
                raise ValueError(f"field '{name}' is not used by {self.test}: leave it out")
        return self


class Survival(_Analysis):
    """Kaplan-Meier estimate of the survival function of `time` (one curve per level
    combination of `by`), where `event` is 1 (or True) for an event and 0 for a censored record.

    Every step releases the records at risk and the events at that time, so each must reach the
    survival threshold: `interval` pools times into intervals of that width (a time t counts as
    the end of its interval, ceil(t / interval) * interval), and `max_time` ends the curve there
    (later records count as censored at `max_time`), where the tail rests on few records.
    """

    kind: Literal["survival"] = "survival"
    time: str = Field(description="Numeric column: time to the event or to censoring.")
    event: str = Field(description="Column holding 1 (or True) for an event, 0 for censored.")
    by: list[str] = Field(default_factory=list)
    interval: float | None = Field(
        default=None, gt=0.0, description="Pool times into intervals of this width."
    )
    max_time: float | None = Field(
        default=None, description="End the curve here; later records count as censored."
    )

    @model_validator(mode="after")
    def _finite(self) -> Survival:
        for name in ("interval", "max_time"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"'{name}' must be a finite number")
        return self


class Script(_Analysis):
    """Arbitrary Python run in the sandbox; its output always goes to human review."""

    kind: Literal["script"] = "script"
    code: str = Field(min_length=1, max_length=200_000)


class DPTransform(BaseModel):
    """The inference a researcher plans on a vector DP answer, so the server answers the
    transformed query `Diag(xi)^(1/2) f(S) + N(0, sigma^2 I)` that serves it best (Shoham &
    Rinott): `region` for the smallest confidence region of the whole vector, `test` for the
    most powerful test of "f(S) = 0 part" against the simple alternative `eta` (one entry per
    component of the answer, in the answer's order)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    goal: Literal["region", "test"]
    eta: list[float] | None = Field(
        default=None,
        description="The alternative minus the null (goal 'test' only), one value per component.",
    )
    null: list[float] | None = Field(
        default=None, description="The null hypothesis f(S) = null (goal 'test'; default 0)."
    )
    alpha: float = Field(default=0.05, gt=0.0, lt=0.5, description="Level / 1 - coverage.")

    @model_validator(mode="after")
    def _eta_for_test(self) -> DPTransform:
        if self.goal == "test":
            if not self.eta:
                raise ValueError("a 'test' transformation needs the alternative 'eta'")
            if not any(v != 0 for v in self.eta):
                raise ValueError("the alternative 'eta' must have a non-zero component")
            if not all(math.isfinite(v) for v in self.eta):
                raise ValueError("'eta' must hold finite numbers")
            if self.null is not None and len(self.null) != len(self.eta):
                raise ValueError("'null' needs one value per component, like 'eta'")
        elif self.eta is not None or self.null is not None:
            raise ValueError("'eta' and 'null' are for goal 'test' only")
        return self


class _DPAnalysis(_Analysis):
    """Common to the differentially private kinds: the privacy request and the groups.

    Either `epsilon` and `delta` (the server calibrates sigma by the analytic Gaussian mechanism)
    or `sigma` (the noise standard deviation on each released component) is given. Groups `by`
    are the declared levels of the grouping columns, every one of them, never levels seen in
    the data.
    """

    epsilon: float | None = Field(default=None, gt=0.0, le=100.0)
    delta: float | None = Field(default=None, gt=0.0, lt=1.0)
    sigma: float | None = Field(default=None, gt=0.0)
    by: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _privacy_request(self) -> _DPAnalysis:
        calibrated = self.epsilon is not None or self.delta is not None
        if calibrated == (self.sigma is not None):
            raise ValueError("give either 'epsilon' and 'delta', or 'sigma', not both or neither")
        if calibrated and (self.epsilon is None or self.delta is None):
            raise ValueError("'epsilon' and 'delta' go together: give both")
        if self.sigma is not None and not math.isfinite(self.sigma):
            raise ValueError("'sigma' must be a finite number")
        return self


class DPCount(_DPAnalysis):
    """Noisy count of records (per group)."""

    kind: Literal["dp_count"] = "dp_count"
    transform: DPTransform | None = None


class DPSum(_DPAnalysis):
    """Noisy sum of a bounded variable (per group), values clipped to the declared bounds."""

    kind: Literal["dp_sum"] = "dp_sum"
    variable: str
    transform: DPTransform | None = None


class DPMean(_DPAnalysis):
    """Noisy means of bounded variables (per group): released as the sums of the values
    centred at the midpoint of their bounds and the count, one Gaussian vector; the client
    divides."""

    kind: Literal["dp_mean"] = "dp_mean"
    variables: list[str] = Field(min_length=1, max_length=50)
    transform: DPTransform | None = None


class DPHistogram(_DPAnalysis):
    """Noisy counts of a bounded variable in declared bins [e_i, e_i+1) (the last one closed)."""

    kind: Literal["dp_histogram"] = "dp_histogram"
    variable: str
    edges: list[float] = Field(min_length=2, max_length=1001)
    transform: DPTransform | None = None

    @model_validator(mode="after")
    def _edges(self) -> DPHistogram:
        if not all(math.isfinite(e) for e in self.edges):
            raise ValueError("'edges' must be finite numbers")
        if any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
            raise ValueError("'edges' must be strictly increasing")
        return self


class DPMeanTest(_DPAnalysis):
    """Two-sample comparison of the mean vectors of bounded variables between the two levels
    of `group` under DP (a privatised Hotelling T^2 test, Dunsche, Kutta & Dette)."""

    kind: Literal["dp_mean_test"] = "dp_mean_test"
    variables: list[str] = Field(min_length=1, max_length=20)
    group: str
    alpha: float = Field(default=0.05, gt=0.0, lt=0.5)

    @model_validator(mode="after")
    def _fields_used(self) -> DPMeanTest:
        # Inherited fields this kind cannot honour are refused, not sealed and ignored.
        if self.by:
            raise ValueError(
                "field 'by' is not used by dp_mean_test: its two groups are the levels of 'group'"
            )
        if self.sigma is not None:
            raise ValueError(
                "field 'sigma' is not used by dp_mean_test: its budget is split over several "
                "statistics, so give 'epsilon' and 'delta'"
            )
        return self


#: Largest epsilon a `synthetic_data` request may name. Far beyond any meaningful guarantee: the
#: bound only catches typos. It admits mu = 50 at delta 1e-9 (epsilon about 1 600), the top of
#: the disclosure check's calibration (docs/synthetic.md, A5); the dataset's budget and
#: `max_tpr_at_5pct` are the controller's real limits.
SYNTH_MAX_EPSILON = 2000.0


class SyntheticData(_Analysis):
    """Differentially private synthetic microdata (MST-style marginal synthesis), released only
    after a disclosure check against the real records (`docs/synthetic.md`)."""

    kind: Literal["synthetic_data"] = "synthetic_data"
    columns: list[str] = Field(min_length=2, max_length=64)
    epsilon: float = Field(gt=0.0, le=SYNTH_MAX_EPSILON)
    delta: float = Field(gt=0.0, lt=1.0)
    method: Literal["mst", "fixed"] = "mst"
    marginals: list[list[str]] = Field(
        default_factory=list,
        max_length=200,
        description="fixed: the cliques to measure besides the one-way marginals; mst: cliques "
        "measured on top of the tree. At most 3 columns each.",
    )
    bins: dict[str, list[float]] = Field(
        default_factory=dict, description="Bin edges of numeric columns, inside their bounds."
    )
    rows: int | None = Field(default=None, ge=1, description="Synthetic rows (default: noisy n).")
    keys: list[str] = Field(default_factory=list, description="Extra quasi-identifiers to attack.")
    targets: list[str] = Field(default_factory=list, description="Extra sensitive targets.")

    @model_validator(mode="after")
    def _shape(self) -> SyntheticData:
        if len(set(self.columns)) != len(self.columns):
            raise ValueError("'columns' must not repeat a column")
        for clique in self.marginals:
            if not 1 <= len(clique) <= 3 or len(set(clique)) != len(clique):
                raise ValueError("each marginal is 1 to 3 distinct columns")
        if self.method == "fixed" and not self.marginals:
            raise ValueError("method 'fixed' needs at least one marginal in 'marginals'")
        for name, edges in self.bins.items():
            if len(edges) < 2 or not all(math.isfinite(e) for e in edges):
                raise ValueError(f"bins of {name!r}: at least two finite edges")
            if any(b <= a for a, b in itertools.pairwise(edges)):
                raise ValueError(f"bins of {name!r}: edges must be strictly increasing")
        return self


ModelFamily = Literal["decision_tree", "random_forest", "gradient_boosting", "logistic_regression"]
FairnessTreatment = Literal["none", "reweighing", "exponentiated_gradient", "threshold_optimizer"]


class ModelParams(BaseModel):
    """Hyper-parameters of a trained model, each within limits the centre declares (the rule set
    may lower them further). Fields that do not apply to the family must stay unset."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_depth: int | None = Field(default=None, ge=1, le=30, description="Trees: maximum depth.")
    max_leaf_nodes: int | None = Field(default=None, ge=2, le=4096, description="Trees: leaves.")
    min_samples_leaf: int | None = Field(
        default=None, ge=1, description="Trees: training records a leaf must hold at least."
    )
    n_estimators: int | None = Field(
        default=None, ge=1, le=500, description="Forests and boosting: number of trees."
    )
    learning_rate: float | None = Field(default=None, gt=0.0, le=1.0, description="Boosting.")
    C: float | None = Field(
        default=None, gt=0.0, le=1e6, description="Logistic regression: inverse regularisation."
    )


class Fairness(BaseModel):
    """A protected attribute: its fairness metrics are reported on the test split, and an
    optional treatment mitigates unfairness (pre-, in- or post-processing)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    protected: str = Field(description="Categorical column holding the protected attribute.")
    treatment: FairnessTreatment = "none"
    constraint: Literal["demographic_parity", "equalized_odds"] = Field(
        default="demographic_parity",
        description="What exponentiated gradient and the threshold optimiser equalise.",
    )


class ModelTraining(_Analysis):
    """Train a classifier with scikit-learn on a train/test split; released (if the checks pass)
    as a JSON description of the model, never a pickle, with its test metrics."""

    kind: Literal["model_training"] = "model_training"
    family: ModelFamily
    target: str = Field(description="Categorical column to predict.")
    features: list[str] = Field(min_length=1, max_length=50)
    params: ModelParams = Field(default_factory=ModelParams)
    test_fraction: float = Field(default=0.3, ge=0.1, le=0.5)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    fairness: Fairness | None = None
    roc: bool = Field(
        default=False,
        description="Also release the ROC curve on the test split (two classes only), "
        "coarsened so that every step adds at least 10 true and 10 false positives (one in "
        "twenty of the smaller class on larger test splits).",
    )


Analysis = Annotated[
    FrequencyTable
    | MagnitudeTable
    | Summary
    | Regression
    | Correlation
    | Histogram
    | StatTest
    | Survival
    | Script
    | DPCount
    | DPSum
    | DPMean
    | DPHistogram
    | DPMeanTest
    | ModelTraining
    | SyntheticData,
    Field(discriminator="kind"),
]

#: The differentially private kinds: answered with noise and a budget, not by rule checks.
DP_KINDS = frozenset({"dp_count", "dp_sum", "dp_mean", "dp_histogram", "dp_mean_test"})

#: Kinds answered under differential privacy that are not single statistics: noise on the
#: server, a budget, and (synthetic data) a disclosure check before release.
SYNTH_KINDS = frozenset({"synthetic_data"})

_ADAPTER: TypeAdapter[Analysis] = TypeAdapter(Analysis)


def parse_analysis(body: bytes | str | dict[str, object]) -> Analysis:
    """Parse an instruction body (canonical JSON bytes, a JSON string or a dict) into an Analysis."""
    if isinstance(body, dict):
        return _ADAPTER.validate_python(body)
    return _ADAPTER.validate_json(body)


def to_body(analysis: Analysis) -> bytes:
    """Serialise an analysis as its canonical JSON body (RFC 8785), the bytes bound in a sequence."""
    return canonical.dumps(analysis.model_dump(mode="json"))
