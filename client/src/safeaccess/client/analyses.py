"""The analysis language: one pydantic model per analysis kind, a discriminated union on `kind`.

An analysis is declarative so that the server knows what each output is and which disclosure
checks apply. Bodies are serialised as canonical JSON (RFC 8785) and bound into the sequence.
`where` filters and regression formulas are strings in our own grammar (see `grammar.py`); they
are parsed, never evaluated as code.

CONTRACT (shared by client, sandbox runner, rules and server): field names below are stable.
New optional fields may be added with defaults.
"""

from __future__ import annotations

from typing import Annotated, Literal

import rfc8785
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

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
    agg: Literal["sum", "mean"] = "sum"
    rows: list[str] = Field(min_length=1)
    cols: list[str] = Field(default_factory=list)
    margins: bool = False
    mitigations: Mitigations = Field(default_factory=Mitigations)


class Summary(_Analysis):
    kind: Literal["summary"] = "summary"
    variables: list[str] = Field(min_length=1)
    statistics: list[SummaryStatistic] = Field(default_factory=_default_statistics)
    quantiles: list[float] = Field(
        default_factory=list, description="Probabilities in (0, 1), used when 'quantiles' is asked."
    )
    quantile_type: Literal[1, 2, 3, 4, 5, 6, 7, 8, 9] = Field(
        default=7, description="Hyndman-Fan quantile definition (7 = R default, 6 = SPSS, 2 = SAS)."
    )
    by: list[str] = Field(default_factory=list)
    round: int | None = Field(default=None, ge=0, le=12, description="Decimals to round to.")

    @model_validator(mode="after")
    def _quantiles_valid(self) -> Summary:
        for p in self.quantiles:
            if not 0.0 < p < 1.0:
                raise ValueError(f"quantile probability {p} must lie strictly between 0 and 1")
        if "quantiles" in self.statistics and not self.quantiles:
            raise ValueError("statistic 'quantiles' needs a list of probabilities in 'quantiles'")
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
        return self


class Script(_Analysis):
    """Arbitrary Python run in the sandbox; its output always goes to human review."""

    kind: Literal["script"] = "script"
    code: str = Field(min_length=1, max_length=200_000)


Analysis = Annotated[
    FrequencyTable
    | MagnitudeTable
    | Summary
    | Regression
    | Correlation
    | Histogram
    | StatTest
    | Script,
    Field(discriminator="kind"),
]

_ADAPTER: TypeAdapter[Analysis] = TypeAdapter(Analysis)


def parse_analysis(body: bytes | str | dict[str, object]) -> Analysis:
    """Parse an instruction body (canonical JSON bytes, a JSON string or a dict) into an Analysis."""
    if isinstance(body, dict):
        return _ADAPTER.validate_python(body)
    return _ADAPTER.validate_json(body)


def to_body(analysis: Analysis) -> bytes:
    """Serialise an analysis as its canonical JSON body (RFC 8785), the bytes bound in a sequence."""
    return rfc8785.dumps(analysis.model_dump(mode="json"))
