"""Risk report of a Gaussian release: closed forms against Monte Carlo and the ROC paper's tables."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from safeaccess.rules.dp import (
    DPParameterError,
    RiskReport,
    gaussian_auc,
    gaussian_tpr,
    risk_report,
    two_release_auc,
)

N = 400_000


def mc_auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(positive > negative) by the Mann–Whitney statistic."""
    ranks = stats.rankdata(np.concatenate([positive, negative]))
    n1, n0 = positive.size, negative.size
    return float((ranks[:n1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


@pytest.mark.parametrize(("sensitivity", "sigma"), [(1.0, 1.0), (1.0, 3.73), (2.0, 0.8)])
def test_single_release_tradeoff_against_monte_carlo(sensitivity: float, sigma: float) -> None:
    rng = np.random.default_rng(11)
    # The attacker observes f(D) + noise or f(D') + noise, f(D') − f(D) = Δ along one axis,
    # and thresholds the observation (the Neyman–Pearson test).
    under_d = rng.normal(0.0, sigma, N)
    under_d_prime = rng.normal(sensitivity, sigma, N)
    for fpr in (0.01, 0.05, 0.1):
        threshold = np.quantile(under_d, 1 - fpr)
        empirical = float(np.mean(under_d_prime > threshold))
        se = np.sqrt(empirical * (1 - empirical) / N) + 0.002
        assert gaussian_tpr(sensitivity, sigma, fpr) == pytest.approx(empirical, abs=4 * se)
    assert gaussian_auc(sensitivity, sigma) == pytest.approx(
        mc_auc(under_d_prime[:100_000], under_d[:100_000]), abs=0.004
    )


@pytest.mark.parametrize(("sensitivity", "sigma"), [(0.5, 1.0), (2.0, 1.0), (1.0, 0.4)])
def test_two_release_auc_against_monte_carlo(sensitivity: float, sigma: float) -> None:
    rng = np.random.default_rng(12)
    m = 100_000
    # The ROC paper's attacker: two releases, K = (X − X')²/(2σ²); null pairs both from D.
    k_null = (rng.normal(0, sigma, m) - rng.normal(0, sigma, m)) ** 2 / (2 * sigma**2)
    k_alt = (rng.normal(sensitivity, sigma, m) - rng.normal(0, sigma, m)) ** 2 / (2 * sigma**2)
    assert two_release_auc(sensitivity, sigma) == pytest.approx(mc_auc(k_alt, k_null), abs=0.004)


@pytest.mark.parametrize(
    ("lam", "table"),
    [(0.05, 0.5098), (0.1, 0.5168), (0.25, 0.5395), (0.5, 0.5744), (1, 0.6342), (2, 0.7315)],
)
def test_two_release_auc_matches_the_papers_table_3(lam: float, table: float) -> None:
    # λ = Δ²/(2σ²); the paper's values are Monte Carlo estimates (±0.002, see errata).
    sigma = 1.0
    sensitivity = np.sqrt(2 * lam) * sigma
    assert two_release_auc(sensitivity, sigma) == pytest.approx(table, abs=0.0025)


def test_the_standard_attacker_is_stronger_than_the_papers() -> None:
    for mu in [0.1, 0.5, 1, 2, 4]:
        assert gaussian_auc(mu, 1.0) > two_release_auc(mu, 1.0)
    assert gaussian_auc(0.0, 1.0) == 0.5
    assert two_release_auc(0.0, 1.0) == 0.5


def test_risk_report_model() -> None:
    report = risk_report(1.0, 2.0, delta=1e-5)
    assert isinstance(report, RiskReport)
    assert [p.fpr for p in report.tradeoff] == [0.01, 0.05, 0.1]
    # Φ(Φ⁻¹(0.05) + 0.5) = Φ(−1.1449) by table lookup.
    assert report.tpr_at(0.05) == pytest.approx(0.126135, abs=1e-6)
    assert report.auc == pytest.approx(0.638163, abs=1e-6)
    assert report.mu == 0.5
    assert report.epsilon is not None and 1.9 < report.epsilon < 2.1
    assert RiskReport.model_validate_json(report.model_dump_json()) == report
    with pytest.raises(DPParameterError, match="sigma"):
        risk_report(1.0, 0.0)
    with pytest.raises(DPParameterError, match="fpr"):
        gaussian_tpr(1.0, 1.0, 1.0)
