"""The server's DP step logic without HTTP: sensitivity from the metadata only, block structure,
the contributor relation, the budget and policy refusals, and a forged statistic refused."""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm

from safeaccess.client.analyses import DPCount, DPHistogram, DPMean, DPSum
from safeaccess.client.metadata import Column, DatasetMetadata, NeighbouringRelation
from safeaccess.rules.outputs import DPStatisticFacts, DPStatisticOutput
from safeaccess.server import dp as dp_release
from safeaccess.server.config import DPConfig
from safeaccess.server.outcome import DPLedgerState, StepOutcome
from safeaccess.server.states import StepState

SIGMA_RATIO_1_1E5 = 3.7306316348  # analytic Gaussian sigma / Delta at (1, 1e-5)


def _meta(unit: str = "record", m: int = 1) -> DatasetMetadata:
    return DatasetMetadata(
        name="d",
        columns=[
            Column(name="g", type="categorical", levels=["a", "b", "c"]),
            Column(name="x", type="continuous", bounds=(-2.0, 6.0)),
            Column(name="y", type="integer", bounds=(0, 3)),
            Column(name="unit", type="identifier", contributor=True),
        ],
        neighbours=NeighbouringRelation(unit=unit, max_records_per_unit=m),  # type: ignore[arg-type]
    )


def _context(spent: float = 0.0, **cfg: object) -> dp_release.DPContext:
    config = DPConfig(**{"epsilon": 1.0, "delta": 1e-5, **cfg})  # type: ignore[arg-type]
    return dp_release.DPContext(
        config=config,
        dataset="d",
        key="d|researcher|r",
        owner="r",
        ledger=DPLedgerState(spent=spent, releases=1 if spent else 0, version=1 if spent else 0),
    )


def _plan(analysis: object, meta: DatasetMetadata | None = None, **kw: object) -> dp_release.DPPlan:
    planned = dp_release.plan(analysis, meta or _meta(), _context(**kw))  # type: ignore[arg-type]
    assert isinstance(planned, dp_release.DPPlan), planned
    return planned


def test_sensitivities_from_declared_bounds() -> None:
    assert _plan(DPCount(by=["g"], sigma=5.0)).sensitivity == 1.0
    assert _plan(DPSum(variable="x", by=["g"], sigma=50.0)).sensitivity == 6.0  # max(|-2|, |6|)
    # Means of x and y with the count: half-widths 4 and 1.5, all moving together in one group.
    mean = _plan(DPMean(variables=["x", "y"], by=["g"], sigma=50.0))
    assert mean.sensitivity == pytest.approx(math.sqrt(16 + 2.25 + 1), rel=1e-12)
    # One record lies in one bin, whatever the number of bins and groups.
    hist = _plan(DPHistogram(variable="x", edges=[-2, 0, 2, 4, 6], by=["g"], sigma=5.0))
    assert hist.sensitivity == 1.0


def test_contributor_relation_multiplies_the_sensitivity() -> None:
    planned = _plan(DPSum(variable="x", sigma=100.0), _meta("contributor", 4))
    assert planned.sensitivity == 24.0 and planned.records_per_unit == 4


def test_calibrated_sigma_matches_the_reference() -> None:
    planned = _plan(DPSum(variable="x", epsilon=1.0, delta=1e-5), epsilon=2.0)
    assert planned.sigma == pytest.approx(6.0 * SIGMA_RATIO_1_1E5, rel=1e-9)


def test_over_budget_is_withheld_with_what_remains() -> None:
    # Budget mu^2 = 1/3.7306^2 = 0.07185; 0.05 spent; (1/4)^2 = 0.0625 does not fit.
    outcome = dp_release.plan(DPCount(sigma=4.0), _meta(), _context(spent=0.05))
    assert isinstance(outcome, StepOutcome) and outcome.state == StepState.WITHHELD
    assert outcome.decision is not None
    message = outcome.decision["findings"][0]["message"]
    assert f"only {1 / SIGMA_RATIO_1_1E5**2 - 0.05:.4g}" in message
    assert outcome.dp_facts is not None and outcome.dp_facts["withheld_by"] == "dp_budget"


def test_policy_limit() -> None:
    outcome = dp_release.plan(
        DPCount(sigma=1.0), _meta(), _context(epsilon=50.0, max_tpr_at_5pct=0.2)
    )
    assert isinstance(outcome, StepOutcome) and outcome.state == StepState.WITHHELD
    # Delta/sigma = 1: the Gaussian test's power at level 0.05 is Phi(1 - z_0.95) (scipy's).
    tpr = norm.cdf(1.0 - norm.ppf(0.95))
    assert outcome.decision is not None
    assert outcome.decision["findings"][0]["message"] == (
        f"this release would let an attacker tell neighbouring datasets apart with TPR "
        f"{tpr:.4g} at FPR 0.05 (Δ = 1, σ = 1); the controller allows at most 0.2: ask for more "
        "noise (a larger σ or a smaller ε)."
    )
    assert outcome.dp_facts is not None and outcome.dp_facts["withheld_by"] == "dp_policy"


def test_a_statistic_with_another_layout_is_refused() -> None:
    analysis = DPCount(by=["g"], sigma=5.0)
    planned = _plan(analysis)
    forged = DPStatisticOutput(
        kind="dp_count",
        by=["g"],
        groups=[["a"], ["b"]],  # one declared level missing
        components=["count"],
        facts=DPStatisticFacts(values=[[1.0], [2.0]], n_total=3),
    )
    with pytest.raises(dp_release.LayoutMismatch):
        dp_release.answer(analysis, planned, forged, _context())


def test_noise_is_added_and_the_charge_recorded() -> None:
    analysis = DPCount(by=["g"], sigma=5.0)
    planned = _plan(analysis)
    exact = DPStatisticOutput(
        kind="dp_count",
        by=["g"],
        groups=[["a"], ["b"], ["c"]],
        components=["count"],
        facts=DPStatisticFacts(values=[[10.0], [20.0], [0.0]], n_total=30),
    )
    outcome = dp_release.answer(analysis, planned, exact, _context())
    assert outcome.state == StepState.RELEASED and outcome.public_output is not None
    values = [row[0] for row in outcome.public_output["values"]]
    assert values != [10.0, 20.0, 0.0]
    assert all(abs(v - t) < 6 * 5.0 for v, t in zip(values, [10.0, 20.0, 0.0], strict=True))
    assert "facts" not in outcome.public_output
    assert outcome.dp_charge is not None
    assert outcome.dp_charge.spent_after == pytest.approx(0.04, rel=1e-12)
    assert outcome.dp_charge.releases_after == 1 and outcome.dp_charge.version == 0
