"""Differential-privacy benchmark: calibration time and the ε the GDP ledger reports after many
Gaussian releases, next to Google's dp-accounting (RDP and PLD accountants) and basic composition.

Run: python benchmarks/dp.py
Prints one line per measurement. The accounting table uses releases that are each calibrated to
(ε₀, δ₀) = (0.5, 1e-6) with Δ = 1, and reports the total ε at δ = 1e-5. Basic composition is
given the same total δ (each release's ε at δ/k, times k). The GDP figure is exact for Gaussian
releases, so every valid accountant reports at least as much; "ratio" is other / ours.
"""

from __future__ import annotations

import argparse
import time

import dp_accounting
from dp_accounting.pld import common, privacy_loss_mechanism
from dp_accounting.rdp import rdp_privacy_accountant

from safeaccess.rules.dp import GaussianLedger, analytic_gaussian_sigma, gaussian_epsilon

GRID = [(e, d) for e in (0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0) for d in (1e-10, 1e-6, 1e-5, 1e-3)]


def calibration_time(repeats: int) -> None:
    start = time.perf_counter()
    for _ in range(repeats):
        for eps, delta in GRID:
            analytic_gaussian_sigma(eps, delta)
    ours = (time.perf_counter() - start) / (repeats * len(GRID))
    start = time.perf_counter()
    for eps, delta in GRID:
        privacy_loss_mechanism.GaussianPrivacyLoss.from_privacy_guarantee(
            common.DifferentialPrivacyParameters(eps, delta), sensitivity=1.0
        )
    theirs = (time.perf_counter() - start) / len(GRID)
    worst = max(
        abs(
            analytic_gaussian_sigma(e, d)
            / privacy_loss_mechanism.GaussianPrivacyLoss.from_privacy_guarantee(
                common.DifferentialPrivacyParameters(e, d), sensitivity=1.0
            ).standard_deviation
            - 1.0
        )
        for e, d in GRID
    )
    print(f"calibration: ours {ours * 1e6:.1f} us/call over {len(GRID)} (eps, delta) pairs")
    print(
        f"calibration: dp-accounting GaussianPrivacyLoss.from_privacy_guarantee "
        f"{theirs * 1e6:.1f} us/call (ratio {theirs / ours:.1f}x); "
        f"largest relative difference in sigma {worst:.2e}"
    )


def accounting(counts: list[int], eps0: float, delta0: float, delta: float) -> None:
    sigma = analytic_gaussian_sigma(eps0, delta0)
    print(
        f"accounting: each release sigma/Delta = {sigma:.6f} (calibrated to eps={eps0}, "
        f"delta={delta0}); total eps at delta={delta}"
    )
    print(f"{'releases':>9} {'GDP (ours)':>12} {'PLD':>12} {'RDP':>12} {'basic':>12}  tightest")
    for k in counts:
        ledger = GaussianLedger()
        for _ in range(k):
            ledger = ledger.charge(1.0, sigma)
        ours = ledger.epsilon_at(delta)

        rdp = rdp_privacy_accountant.RdpAccountant()
        rdp.compose(dp_accounting.GaussianDpEvent(sigma), k)
        rdp_eps = rdp.get_epsilon(delta)

        pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
        pld.compose(dp_accounting.GaussianDpEvent(sigma), k)
        pld_eps = pld.get_epsilon(delta)

        basic = k * gaussian_epsilon(1.0 / sigma, delta / k)
        tightest = "ours" if ours <= min(rdp_eps, pld_eps, basic) else "NOT OURS"
        print(
            f"{k:>9} {ours:>12.4f} {pld_eps:>12.4f} {rdp_eps:>12.4f} {basic:>12.4f}  {tightest}"
            f"   (ratio PLD {pld_eps / ours:.4f}, RDP {rdp_eps / ours:.3f}, basic {basic / ours:.1f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20, help="calibration repetitions")
    args = parser.parse_args()
    calibration_time(args.repeats)
    accounting([10, 100, 1000], eps0=0.5, delta0=1e-6, delta=1e-5)


if __name__ == "__main__":
    main()
