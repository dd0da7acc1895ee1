"""Summary statistics per group and variable -> SummaryOutput.

Definitions (stated because output checkers and researchers compare against other software):
- sd and var use the n - 1 denominator.
- quantiles (and the median, and the ends of the iqr) are windowed: the mean of the
  QUANTILE_WINDOW (10) order statistics nearest the position Hyndman & Fan (1996) type 1-9 gives
  the quantile ((n + 1) / 2 for the median), so no released quantile is one record's value
  (`safeaccess.rules.reconstruction.windowed_quantile_weights`, which the release check and the
  reconstruction check use too). iqr is q(0.75) - q(0.25) of the same definition.
- skewness is the adjusted Fisher-Pearson coefficient G1 = sqrt(n(n-1))/(n-2) * g1 (SAS, SPSS,
  Excel; scipy.stats.skew(bias=False)); needs n >= 3.
- kurtosis is the excess kurtosis G2 = ((n+1) g2 + 6) (n-1) / ((n-2)(n-3)) (SAS, SPSS, Excel;
  scipy.stats.kurtosis(bias=False)); needs n >= 4.
- mode is the most frequent value; ties go to the smallest value.
- rounding: half-to-even on the computed float (Python's round), counts are never rounded.
Statistics that are undefined for a group (too few values, zero variance) are None.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd

from safeaccess.client.analyses import Summary
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.facts import dominance_facts, spread_facts
from safeaccess.rules.outputs import (
    BoundClass,
    SummaryFacts,
    SummaryGroup,
    SummaryGroupFacts,
    SummaryOutput,
    SummaryVariableFacts,
    VariableSummary,
)
from safeaccess.rules.reconstruction._exact import (
    QUANTILE_WINDOW,
    QuantileWeights,
    windowed_median_weights,
    windowed_quantile_weights,
)
from safeaccess.sandbox.runner.compute import missing
from safeaccess.sandbox.runner.compute._common import (
    fnum,
    group,
    label_text,
    numeric_values,
    query_set,
    require_columns,
)
from safeaccess.sandbox.runner.compute.bounds import bound_classes, record_bounds

# Hyndman & Fan (1996) sample quantile types -> numpy.quantile method names.
HF_METHODS: dict[int, str] = {
    1: "inverted_cdf",
    2: "averaged_inverted_cdf",
    3: "closest_observation",
    4: "interpolated_inverted_cdf",
    5: "hazen",
    6: "weibull",
    7: "linear",
    8: "median_unbiased",
    9: "normal_unbiased",
}

# Above this many points a declared range is not a "small scale" for reconstruction purposes.
MAX_SCALE_POINTS = 20


def quantile_key(p: float) -> str:
    """The stats key of quantile p, e.g. 'q0.25'."""
    return f"q{p!r}"


def hf_quantile(values: np.ndarray, p: float, hf_type: int) -> float:
    """Sample quantile of Hyndman-Fan type `hf_type` (values non-empty, no NaN)."""
    return float(np.quantile(values, p, method=HF_METHODS[hf_type]))  # type: ignore[call-overload]


def _apply(sorted_values: np.ndarray, weights: QuantileWeights) -> float:
    return float(sum(float(w) * sorted_values[i - 1] for i, w in weights))


def windowed_quantile(sorted_values: np.ndarray, p: float, hf_type: int) -> float:
    """The released quantile p: the mean of the QUANTILE_WINDOW order statistics nearest the
    type-`hf_type` position (sorted_values non-empty, no NaN)."""
    n = sorted_values.size
    return _apply(sorted_values, windowed_quantile_weights(n, Fraction(repr(p)), hf_type))


def windowed_median(sorted_values: np.ndarray) -> float:
    """The released median: the mean of the QUANTILE_WINDOW order statistics around the middle."""
    return _apply(sorted_values, windowed_median_weights(sorted_values.size))


def _standardised_moment(values: np.ndarray, order: int, least: int) -> float | None:
    """m_order / m2^(order / 2) of the (biased) central sample moments; None with fewer than
    `least` values or zero variance."""
    if values.size < least:
        return None
    dev = values - values.mean()
    m2 = float(np.mean(dev**2))
    if m2 == 0.0:
        return None
    return float(np.mean(dev**order)) / m2 ** (order / 2)


def skewness(values: np.ndarray) -> float | None:
    """Adjusted Fisher-Pearson skewness G1; None if n < 3 or zero variance."""
    g1 = _standardised_moment(values, 3, least=3)
    if g1 is None:
        return None
    n = values.size
    return math.sqrt(n * (n - 1)) / (n - 2) * g1


def excess_kurtosis(values: np.ndarray) -> float | None:
    """Sample excess kurtosis G2; None if n < 4 or zero variance."""
    b2 = _standardised_moment(values, 4, least=4)
    if b2 is None:
        return None
    n = values.size
    g2 = b2 - 3.0
    return ((n + 1) * g2 + 6.0) * (n - 1) / ((n - 2) * (n - 3))


def _mode(values: np.ndarray) -> tuple[float, int]:
    uniq, counts = np.unique(values, return_counts=True)
    best = int(np.argmax(counts))  # argmax takes the first maximum: the smallest value on ties
    return float(uniq[best]), int(counts[best])


def _scale(name: str, metadata: DatasetMetadata) -> tuple[int, int] | None:
    column = metadata.column(name)
    if column is None:
        return None
    if column.scale is not None:
        return column.scale
    if column.type in ("integer", "ordinal") and column.bounds is not None:
        lo, hi = column.bounds
        if float(lo).is_integer() and float(hi).is_integer() and hi - lo <= MAX_SCALE_POINTS:
            return int(lo), int(hi)
    return None


def _is_integer(name: str, metadata: DatasetMetadata) -> bool:
    column = metadata.column(name)
    return column is not None and column.type in ("integer", "ordinal")


def _value_key(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _statistics(analysis: Summary, values: np.ndarray) -> dict[str, float | None]:
    n = values.size
    ordered = np.sort(values)
    stats: dict[str, float | None] = {}
    for name in analysis.statistics:
        if name == "count":
            stats["count"] = float(n)
        elif n == 0:
            if name == "quantiles":
                stats.update({quantile_key(p): None for p in analysis.quantiles})
            else:
                stats[name] = None
        elif name == "mean":
            stats["mean"] = float(values.mean())
        elif name == "sd":
            stats["sd"] = float(values.std(ddof=1)) if n > 1 else None
        elif name == "var":
            stats["var"] = float(values.var(ddof=1)) if n > 1 else None
        elif name == "median":
            stats["median"] = windowed_median(ordered)
        elif name == "quantiles":
            for p in analysis.quantiles:
                stats[quantile_key(p)] = windowed_quantile(ordered, p, analysis.quantile_type)
        elif name == "min":
            stats["min"] = float(values.min())
        elif name == "max":
            stats["max"] = float(values.max())
        elif name == "mode":
            stats["mode"] = _mode(values)[0]
        elif name == "skewness":
            stats["skewness"] = skewness(values)
        elif name == "kurtosis":
            stats["kurtosis"] = excess_kurtosis(values)
        elif name == "iqr":
            stats["iqr"] = windowed_quantile(
                ordered, 0.75, analysis.quantile_type
            ) - windowed_quantile(ordered, 0.25, analysis.quantile_type)
    out: dict[str, float | None] = {}
    for key, value in stats.items():
        value = fnum(value)
        if value is not None and analysis.round is not None and key != "count":
            value = round(value, analysis.round)
        out[key] = value
    return out


def _declared(name: str, metadata: DatasetMetadata) -> tuple[float, float] | None:
    column = metadata.column(name)
    if column is None:
        return None
    if column.bounds is not None:
        return float(column.bounds[0]), float(column.bounds[1])
    if column.scale is not None:
        return float(column.scale[0]), float(column.scale[1])
    return None


def _tightened(
    scale: tuple[int, int] | None, classes: list[BoundClass], integer: bool
) -> tuple[int, int] | None:
    """The reconstruction scale once a filter confines every record of the group to one
    interval: the exact analysis then runs on the values the filter leaves possible."""
    if len(classes) != 1 or classes[0].low is None or classes[0].high is None:
        return scale
    low, high = math.ceil(classes[0].low), math.floor(classes[0].high)
    if scale is not None:
        low, high = max(low, scale[0]), min(high, scale[1])
    elif not integer or high - low > MAX_SCALE_POINTS:
        return None
    return (low, high) if low < high else scale


def _facts(
    raw: np.ndarray,
    scale: tuple[int, int] | None,
    contributor: np.ndarray | None,
    bounds: tuple[np.ndarray, ...] | None = None,
    integer: bool = False,
) -> SummaryVariableFacts:
    present = ~np.isnan(raw)
    values = raw[present]
    n = values.size
    classes = None if bounds is None else bound_classes(*(a[present] for a in bounds))
    if classes is not None:
        scale = _tightened(scale, classes, integer)
    uniq, counts = np.unique(values, return_counts=True)
    value_counts: dict[str, int] | None = None
    if scale is not None and np.all(np.equal(np.mod(values, 1), 0)):
        value_counts = {str(k): 0 for k in range(scale[0], scale[1] + 1)}
        for v, c in zip(uniq, counts, strict=True):
            value_counts[_value_key(float(v))] = int(c)
    return SummaryVariableFacts(
        n=n,
        n_distinct=int(uniq.size),
        scale=scale,
        value_counts=value_counts,
        mode_share=float(counts.max() / n) if n else None,
        variance_zero=bool(n > 0 and uniq.size == 1),
        # Dominance and extremes (top contributions, records at min/max), computed by the rules'
        # own helper so researcher-side checks and the server agree.
        **dominance_facts(raw, contributor),
        spread=spread_facts(raw, contributor),
        quantile_window=min(QUANTILE_WINDOW, n) if n else None,
        bounds=classes,
    )


def summary(
    analysis: Summary, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> SummaryOutput:
    """Summary statistics of each variable in each `by` group (all declared level combinations)."""
    require_columns(frame, [*analysis.variables, *analysis.by])
    columns = {v: numeric_values(frame, v) for v in analysis.variables}
    scales = {v: _scale(v, metadata) for v in analysis.variables}
    # what the filter itself tells about each selected record's value (per record: see bounds.py)
    filter_bounds = {
        v: record_bounds(analysis.where, frame, v, _declared(v, metadata))
        for v in analysis.variables
    }
    integer = {v: _is_integer(v, metadata) for v in analysis.variables}
    unit = metadata.contributor_column
    units = frame[unit].to_numpy() if unit is not None and unit in frame.columns else None
    groups = group(frame, list(analysis.by), metadata)
    out_groups: list[SummaryGroup] = []
    fact_groups: list[SummaryGroupFacts] = []
    # Sort records by group once and slice, rather than scanning every record for every group.
    order = np.argsort(groups.codes, kind="stable")
    sorted_codes = groups.codes[order]
    bounds = np.searchsorted(sorted_codes, np.arange(len(groups.labels) + 1), side="left")
    for g, labels in enumerate(groups.labels):
        members = order[bounds[g] : bounds[g + 1]]
        summaries: list[VariableSummary] = []
        var_facts: dict[str, SummaryVariableFacts] = {}
        for v in analysis.variables:
            raw = columns[v][members]
            values = raw[~np.isnan(raw)]
            summaries.append(
                VariableSummary(variable=v, n=values.size, stats=_statistics(analysis, values))
            )
            fb = filter_bounds[v]
            var_facts[v] = _facts(
                raw,
                scales[v],
                None if units is None else units[members],
                None if fb is None else tuple(a[members] for a in fb),
                integer[v],
            )
        out_groups.append(SummaryGroup(labels=labels, variables=summaries))
        fact_groups.append(
            SummaryGroupFacts(labels=labels, n=int(members.size), variables=var_facts)
        )
    # Per variable and group, the records whose value is missing; then the records in no group.
    missing_parts = [
        missing.per_group([v], np.isnan(columns[v]), groups.codes, groups.labels, frame, n_records)
        for v in analysis.variables
    ]
    counts, sets = missing.joined(
        *missing_parts, missing.keys(list(analysis.by), frame, metadata, n_records)
    )
    # Per variable, the records behind its n and statistics: the group's records whose value
    # is present. Its n is a count of them, so the auditor must see them, not the group: the
    # group's size less n is the missing count (issue 41). One set per variable whatever the
    # data, so the arrays are numbered alike on the domain grid.
    names = [label_text(lab) for lab in groups.labels]
    present = [
        query_set(names, frame, np.where(np.isnan(columns[v]), -1, groups.codes), n_records)
        for v in analysis.variables
    ]
    return SummaryOutput(
        by=list(analysis.by),
        statistics=list(analysis.statistics),
        quantile_type=analysis.quantile_type,
        round=analysis.round,
        groups=out_groups,
        missing=counts,
        facts=SummaryFacts(
            missing_query_sets=sets,
            groups=fact_groups,
            query_set=present[0],
            extra_query_sets=present[1:],
            n_total=int((groups.codes >= 0).sum()),
        ),
    )
