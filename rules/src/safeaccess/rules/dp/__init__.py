"""Differential privacy for safeaccess: analytic Gaussian calibration, exact Gaussian (GDP)
accounting, the risk report of a noisy release, Shoham–Rinott transformed queries
(`safeaccess.rules.dp.transform`) and the DP two-sample Hotelling test
(`safeaccess.rules.dp.hotelling`).

Everything importable from here is pure computation with no heavy dependency. Drawing noise needs
OpenDP and lives in `safeaccess.rules.dp.noise`, which only the server imports (the rules package
is also installed in the sandbox image, which must stay free of it); install it with the
`safeaccess-rules[noise]` extra.
"""

from safeaccess.rules.dp.accounting import (
    BudgetExceededError,
    GaussianLedger,
    compose_mu,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_mu_for,
    release_share,
)
from safeaccess.rules.dp.calibration import analytic_gaussian_sigma, gaussian_delta_for
from safeaccess.rules.dp.errors import DPParameterError
from safeaccess.rules.dp.risk import (
    RiskReport,
    TradeoffPoint,
    gaussian_auc,
    gaussian_tpr,
    risk_report,
    two_release_auc,
)

__all__ = [
    "BudgetExceededError",
    "DPParameterError",
    "GaussianLedger",
    "RiskReport",
    "TradeoffPoint",
    "analytic_gaussian_sigma",
    "compose_mu",
    "gaussian_auc",
    "gaussian_delta",
    "gaussian_delta_for",
    "gaussian_epsilon",
    "gaussian_mu_for",
    "gaussian_tpr",
    "release_share",
    "risk_report",
    "two_release_auc",
]
