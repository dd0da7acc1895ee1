"""Hypothesis tests -> TestOutput.

- chi2_independence: Pearson's chi-square on the rows x cols contingency table, *without* Yates'
  continuity correction for any table size (like R's chisq.test(correct = FALSE)), so that the
  statistic is the same Pearson statistic for 2x2 and larger tables and can be checked against the
  released table by hand. Declared levels with no records stay in the table in the facts (zeros
  matter for disclosure) but are dropped from the test itself, where they would give zero
  expected counts. The facts carry the full table.
- t_two_sample: Welch's t test (unequal variances) unless `equal_var`, comparing `variable`
  between the two levels of `group` (first level minus second, in declared/sorted level order).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from safeaccess.client.analyses import StatTest
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.rules.outputs import TestFacts, TestOutput
from safeaccess.sandbox.runner.compute import missing
from safeaccess.sandbox.runner.compute._common import (
    AnalysisError,
    code_variable,
    fnum,
    group,
    label_text,
    numeric_values,
    query_set,
    require_columns,
)
from safeaccess.sandbox.runner.compute.leverage import group_indicator_hats, leverage_facts


def _chi2(
    analysis: StatTest, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> TestOutput:
    from scipy.stats import chi2_contingency

    assert analysis.rows is not None and analysis.cols is not None  # checked by the model
    require_columns(frame, [analysis.rows, analysis.cols])
    cells = group(frame, [analysis.rows, analysis.cols], metadata)
    n_r, n_c = (len(levels) for levels in cells.levels)
    counts = np.bincount(cells.codes[cells.codes >= 0], minlength=n_r * n_c).reshape(n_r, n_c)
    used = counts[counts.sum(axis=1) > 0][:, counts.sum(axis=0) > 0]
    if used.shape[0] < 2 or used.shape[1] < 2:
        raise AnalysisError(
            "degenerate_table",
            f"{analysis.rows} and {analysis.cols} need at least two observed levels each",
        )
    statistic, p_value, dof, expected = chi2_contingency(used, correction=False)
    n = int(counts.sum())
    left_out, left_out_sets = missing.keys(
        [analysis.rows, analysis.cols], frame, metadata, n_records
    )
    return TestOutput(
        test="chi2_independence",
        statistic=float(statistic),
        df=float(dof),
        p_value=float(p_value),
        n=n,
        details={"min_expected": fnum(np.min(expected))},
        missing=left_out,
        facts=TestFacts(
            n=n,
            missing_query_sets=left_out_sets,
            table=counts.tolist(),
            query_set=query_set(
                [label_text(lab) for lab in cells.labels], frame, cells.codes, n_records
            ),
        ),
    )


def _t_test(
    analysis: StatTest, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> TestOutput:
    from scipy.stats import ttest_ind

    assert analysis.variable is not None and analysis.group is not None  # checked by the model
    require_columns(frame, [analysis.variable, analysis.group])
    values = numeric_values(frame, analysis.variable)
    groups = code_variable(frame, analysis.group, metadata)
    valid = (groups.codes >= 0) & ~np.isnan(values)
    observed = sorted(set(groups.codes[valid].tolist()))
    if len(groups.levels) != 2 and len(observed) != 2:
        raise AnalysisError(
            "bad_group",
            # How many levels occur among the records used is not said: one level would be a
            # class disclosure about the selected records.
            f"t_two_sample needs a group variable with exactly two levels among the records "
            f"used; {analysis.group} does not have that",
        )
    pair = observed if len(groups.levels) != 2 else [0, 1]
    samples = [values[valid & (groups.codes == g)] for g in pair]
    if any(s.size < 2 for s in samples):
        raise AnalysisError("too_few_rows", "each group needs at least two records with a value")
    result = ttest_ind(samples[0], samples[1], equal_var=analysis.equal_var)
    v0, v1 = (float(s.var(ddof=1)) for s in samples)
    n0, n1 = samples[0].size, samples[1].size
    if analysis.equal_var:
        df = float(n0 + n1 - 2)
    else:
        a, b = v0 / n0, v1 / n1
        df = (a + b) ** 2 / (a**2 / (n0 - 1) + b**2 / (n1 - 1)) if a + b > 0 else math.nan
    if not (math.isfinite(float(result.statistic)) and math.isfinite(df)):
        raise AnalysisError("zero_variance", "both groups have no variation; the test is undefined")
    names = [str(groups.levels[g]) for g in pair]
    cell = np.full(len(frame), -1, dtype=np.int64)
    for i, g in enumerate(pair):
        cell[valid & (groups.codes == g)] = i
    # Per level of the group, its records without a value; then those without a group.
    left_out, left_out_sets = missing.joined(
        missing.per_group(
            [analysis.variable],
            np.isnan(values),
            groups.codes,
            [[level] for level in groups.levels],
            frame,
            n_records,
        ),
        missing.keys([analysis.group], frame, metadata, n_records),
    )
    return TestOutput(
        test="t_two_sample",
        statistic=float(result.statistic),
        df=df,
        p_value=float(result.pvalue),
        n=int(n0 + n1),
        details={
            f"mean[{names[0]}]": float(samples[0].mean()),
            f"mean[{names[1]}]": float(samples[1].mean()),
            "difference": float(samples[0].mean() - samples[1].mean()),
        },
        missing=left_out,
        facts=TestFacts(
            n=int(n0 + n1),
            missing_query_sets=left_out_sets,
            group_counts={names[0]: int(n0), names[1]: int(n1)},
            query_set=query_set(names, frame, cell, n_records),
            # the t test is the regression of the variable on the group indicator
            leverage=leverage_facts(group_indicator_hats([int(n0), int(n1)])),
        ),
    )


def stat_test(
    analysis: StatTest, frame: pd.DataFrame, metadata: DatasetMetadata, n_records: int
) -> TestOutput:
    """Run the requested test."""
    if analysis.test == "chi2_independence":
        return _chi2(analysis, frame, metadata, n_records)
    return _t_test(analysis, frame, metadata, n_records)
