"""Every DP kind against the truth computed with pandas on the raw frame: each released estimate
within 5 of its own released standard errors, over several releases (fresh noise each), and the
released standard errors consistent with the noise drawn (the mean of the squared standardised
errors near 1). Missing values are left out and counted, never imputed."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from fidelity_data import INCOME_BOUNDS, REGIONS, Fidelity, metadata
from scipy import stats

from safeaccess.client.analyses import (
    Analysis,
    DPCount,
    DPHistogram,
    DPMean,
    DPMeanTest,
    DPSum,
)
from safeaccess.client.plan import Plan
from safeaccess.client.results import StepResult
from safeaccess.client.session import connect
from safeaccess.client.validation import AnalysisInvalid

RELEASES = 4  # independent noise draws of each request


def _released(results: list[StepResult]) -> list[StepResult]:
    assert [r.status for r in results] == ["released"] * len(results), [
        (r.status, r.error_message) for r in results
    ]
    return results


def _check(z: list[float]) -> None:
    """Standardised errors: none beyond 5, and their mean square consistent with 1: for n
    values it is chi2_n / n, held within its 1e-6 and 1 - 1e-6 quantiles (a wrong standard
    error by a factor of 2 either way fails, the right one fails once in 500 000 runs)."""
    arr = np.asarray(z)
    assert np.all(np.abs(arr) < 5), arr
    n = len(arr)
    assert n >= 16
    low, high = stats.chi2.ppf(1e-6, n) / n, stats.chi2.isf(1e-6, n) / n
    assert low < float(np.mean(arr**2)) < high, (float(np.mean(arr**2)), low, high)


def _z(estimate: float, truth: float, se: float) -> float:
    assert math.isfinite(se) and se > 0
    return (estimate - truth) / se


def test_dp_mean_by_group_is_the_mean_of_the_present_values(fidelity: Fidelity) -> None:
    frame = fidelity.frame
    analyses: list[Analysis] = [
        DPMean(variables=["income"], by=["region"], epsilon=1.0, delta=1e-7)
    ] * RELEASES
    results = _released(fidelity.run(analyses, dataset="dpsurvey"))
    truth = frame.groupby("region", observed=False)["income"]
    means, counts, missing = truth.mean(), truth.count(), truth.apply(lambda s: s.isna().sum())
    z: list[float] = []
    mean_z: list[float] = []
    for result in results:
        dp = result.dp
        assert dp is not None
        assert dp.components == ["sum(income - 125000)", "count", "missing"]
        est, se = dp.estimates(), dp.standard_errors()
        # The count is not buried under the sum's noise (the issue: sigma 467 866 records).
        assert se[0][1] < 10 and se[0][2] < 10
        for g, (region,) in enumerate(dp.groups):
            z.append(_z(est[g][1], counts[region], se[g][1]))
            z.append(_z(est[g][2], missing[region], se[g][2]))
            centred = (frame.loc[frame["region"] == region, "income"].dropna() - 125_000).sum()
            z.append(_z(est[g][0], centred, se[g][0]))
        rows = dp.means()
        for row in rows:
            region = row["group"][0]
            mean_z.append(_z(row["mean"], means[region], row["std_error"]))
        # The frame carries the same means, their standard errors and the missing counts.
        shown = result.frame()
        assert list(shown["region"]) == REGIONS
        assert list(shown["mean"]) == [r["mean"] for r in rows]
        assert "missing" in shown.columns
    _check(z)
    _check(mean_z)
    # The large groups' means are within a fraction of a percent: a useful answer at epsilon 1.
    assert abs(results[0].dp.means()[0]["mean"] / means["north"] - 1) < 0.05  # type: ignore[union-attr]


def test_dp_mean_of_two_variables_drops_incomplete_records(fidelity: Fidelity) -> None:
    frame = fidelity.frame
    analyses: list[Analysis] = [
        DPMean(variables=["age", "income"], by=["sex"], epsilon=1.0, delta=1e-7)
    ] * RELEASES
    results = _released(fidelity.run(analyses, dataset="dpsurvey"))
    complete = frame.dropna(subset=["age", "income"])
    mean_z: list[float] = []
    z: list[float] = []
    for result in results:
        dp = result.dp
        assert dp is not None
        est, se = dp.estimates(), dp.standard_errors()
        for g, (sex,) in enumerate(dp.groups):
            rows = complete[complete["sex"] == sex]
            z.append(_z(est[g][2], len(rows), se[g][2]))
            z.append(_z(est[g][3], int((frame["sex"] == sex).sum()) - len(rows), se[g][3]))
            z.append(_z(est[g][0], (rows["age"] - 55.5).sum(), se[g][0]))
            z.append(_z(est[g][1], (rows["income"] - 125_000).sum(), se[g][1]))
        for row in dp.means():
            rows = complete[complete["sex"] == row["group"][0]]
            mean_z.append(_z(row["mean"], rows[row["variable"]].mean(), row["std_error"]))
    _check(z)
    # Eight means per sequence of four: each within 5 standard errors (a looser mean square,
    # the delta method being an approximation).
    assert all(abs(v) < 5 for v in mean_z) and len(mean_z) == 4 * RELEASES


def test_dp_count_sum_and_histogram_within_their_noise(fidelity: Fidelity) -> None:
    frame = fidelity.frame
    edges = [16.0, 30.0, 45.0, 60.0, 75.0, 95.0]
    analyses: list[Analysis] = []
    for _ in range(RELEASES):
        analyses += [
            DPCount(by=["region"], epsilon=0.5, delta=1e-7),
            DPSum(variable="income", by=["sex"], epsilon=1.0, delta=1e-7),
            DPHistogram(
                variable="income",
                edges=[0, 1, 20_000, 60_000, 250_000],
                by=["sex"],
                epsilon=1.0,
                delta=1e-7,
            ),
            DPHistogram(variable="age", edges=edges, epsilon=1.0, delta=1e-7),
        ]
    results = _released(fidelity.run(analyses, dataset="dpsurvey"))
    z: list[float] = []
    counts = frame["region"].value_counts()
    for i, result in enumerate(results):
        dp = result.dp
        assert dp is not None
        est, se = dp.estimates(), dp.standard_errors()
        if i % 4 == 0:
            z += [_z(est[g][0], counts[r], se[g][0]) for g, (r,) in enumerate(dp.groups)]
        elif i % 4 == 1:
            assert dp.components == ["sum(income)", "missing"]
            for g, (sex,) in enumerate(dp.groups):
                values = frame.loc[frame["sex"] == sex, "income"]
                z.append(_z(est[g][0], values.sum(), se[g][0]))  # pandas skips the missing
                z.append(_z(est[g][1], values.isna().sum(), se[g][1]))
            # The missing count costs nothing: the sum keeps the whole budget's sigma.
            assert se[0][0] == pytest.approx(dp.sigma, rel=1e-12)
        elif i % 4 == 2:
            for g, (sex,) in enumerate(dp.groups):
                values = frame.loc[frame["sex"] == sex, "income"]
                # Exact zeros fall in [0, 1).
                hist, _ = np.histogram(values.dropna(), bins=[0, 1, 20_000, 60_000, 250_000])
                truth = [*hist.tolist(), int(values.isna().sum())]
                z += [_z(e, t, s) for e, t, s in zip(est[g], truth, se[g], strict=True)]
        else:
            hist, _ = np.histogram(frame["age"].clip(16, 95), bins=edges)
            z += [_z(e, t, s) for e, t, s in zip(est[0], [*hist, 0], se[0], strict=True)]
    _check(z)


def test_transformed_queries_are_estimated_within_their_noise(fidelity: Fidelity) -> None:
    frame = fidelity.frame
    analyses: list[Analysis] = []
    for _ in range(RELEASES):
        analyses += [
            DPMean(
                variables=["age", "income"],
                by=["sex"],
                epsilon=1.0,
                delta=1e-7,
                transform={"goal": "region"},
            ),
            DPCount(
                by=["sex"], epsilon=1.0, delta=1e-7, transform={"goal": "test", "eta": [0.0, 50.0]}
            ),
        ]
    results = _released(fidelity.run(analyses, dataset="dpsurvey"))
    z: list[float] = []
    counts = frame["sex"].value_counts()
    complete = frame.dropna(subset=["age", "income"])
    for i, result in enumerate(results):
        dp = result.dp
        assert dp is not None and dp.weights is not None
        est, se = dp.estimates(), dp.standard_errors()
        if i % 2 == 0:
            for g, (sex,) in enumerate(dp.groups):
                rows = complete[complete["sex"] == sex]
                truth = [
                    (rows["age"] - 55.5).sum(),
                    (rows["income"] - 125_000).sum(),
                    len(rows),
                    int((frame["sex"] == sex).sum()) - len(rows),
                ]
                z += [_z(e, t, s) for e, t, s in zip(est[g], truth, se[g], strict=True)]
        else:
            # All weight on the men's count: the women's has no estimate (infinite error).
            assert math.isinf(se[0][0])
            z.append(_z(est[1][0], counts["M"], se[1][0]))
    _check(z)


def test_dp_mean_test_standard_errors_are_the_noise_of_each_statistic(
    fidelity: Fidelity,
) -> None:
    frame = fidelity.frame
    analyses: list[Analysis] = [
        DPMeanTest(variables=["age", "income"], group="sex", epsilon=1.0, delta=1e-7)
    ] * (2 * RELEASES)
    results = _released(fidelity.run(analyses, dataset="dpsurvey"))
    complete = frame.dropna(subset=["age", "income"])
    z: list[float] = []
    for result in results:
        dp = result.dp
        assert dp is not None and result.output is not None
        test = result.output["test"]
        est, se = dp.estimates(), dp.standard_errors()
        for g, (sex,) in enumerate(dp.groups):
            rows = complete[complete["sex"] == sex]
            assert se[g] == [test["sigma_sum"], test["sigma_sum"], test["sigma_count"]]
            truth = [(rows["age"] - 55.5).sum(), (rows["income"] - 125_000).sum(), len(rows)]
            z += [_z(e, t, s) for e, t, s in zip(est[g], truth, se[g], strict=True)]
        for row in dp.means():
            rows = complete[complete["sex"] == row["group"][0]]
            assert abs(row["mean"] - rows[row["variable"]].mean()) < 5 * row["std_error"]
    _check(z)


def test_a_useless_dp_mean_is_refused_at_plan_time_and_at_reveal(fidelity: Fidelity) -> None:
    who = fidelity.free.pop()
    with connect(fidelity.url, fidelity.keys[who], who) as session:
        plan = session.plan("dpsurvey").dp_mean("income", by="region", epsilon=0.001, delta=1e-7)
        with pytest.raises(AnalysisInvalid) as refused:
            session.check_plan(plan)
        message = str(refused.value)
        assert "epsilon = 0.001" in message and "bounds" in message and "'by'" in message
        # A plan sealed without the check is refused at reveal, before anything runs or is spent.
        sealed = (
            Plan("dpsurvey", metadata("dpsurvey"))
            .dp_mean("income", by="region", epsilon=0.001, delta=1e-7)
            .seal(fidelity.keys[who], researcher=who, project="p1", server=fidelity.server_id)
        )
        (result,) = session.run(sealed)
    assert result.status == "failed" and result.error_code == "invalid_analysis"
    assert "epsilon = 0.001" in (result.error_message or "")
    # Without groups the same request answers: the whole dataset is large enough.
    (ok,) = fidelity.run(
        [DPMean(variables=["income"], epsilon=0.01, delta=1e-7)], dataset="dpsurvey"
    )
    assert ok.released


def test_income_bounds_are_the_declared_ones() -> None:
    # Guards the hand-written centre 125 000 above.
    assert INCOME_BOUNDS == (0.0, 250_000.0)
    assert pd.Series(REGIONS).is_unique
