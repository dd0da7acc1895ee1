"""Differential-privacy benchmark: calibration time and the ε the GDP ledger reports after many
Gaussian releases, next to Google's dp-accounting (RDP and PLD accountants) and basic composition.

Run: python benchmarks/dp.py [--hotelling REPS]
Prints one line per measurement. The accounting table uses releases that are each calibrated to
(ε₀, δ₀) = (0.5, 1e-6) with Δ = 1, and reports the total ε at δ = 1e-5. Basic composition is
given the same total δ (each release's ε at δ/k, times k). The GDP figure is exact for Gaussian
releases, so every valid accountant reports at least as much; "ratio" is other / ours.
"""

from __future__ import annotations

import argparse
import math
import time

import dp_accounting
import numpy as np
from dp_accounting.pld import common, privacy_loss_mechanism
from dp_accounting.rdp import rdp_privacy_accountant

from safeaccess.rules.dp import (
    GaussianLedger,
    analytic_gaussian_sigma,
    gaussian_epsilon,
    gaussian_mu_for,
)
from safeaccess.rules.dp.hotelling import (
    GroupStatistics,
    hotelling_test,
    release_mean_comparison,
)

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


def server_latency(rows: int, steps: int) -> None:
    """A DP answer's wall time through the real server next to a rule-checked answer.

    Both are one step of a sealed sequence over real HTTP with the process sandbox, on the same
    generated census: a frequency table region x sex checked by the rules, and a DP count by
    region x sex (the same cells) with noise, ledger check and charge. Median and p95 of `steps`
    reveals each (the first, which opens the sequence, is not counted).
    """
    import statistics
    import tempfile
    from pathlib import Path

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from safeaccess.client.analyses import Analysis, DPCount, FrequencyTable, to_body
    from safeaccess.client.keys import fingerprint, public_key_text
    from safeaccess.client.protocol import seal
    from safeaccess.client.session import connect
    from safeaccess.server.config import DataDir, initialise
    from safeaccess.server.datasets import register_dataset
    from safeaccess.server.demo.data import census_metadata, generate_census
    from safeaccess.server.http.app import create_app
    from safeaccess.server.http.embedded import EmbeddedServer
    from safeaccess.server.service import Service
    from safeaccess.server.store import Store

    def percentile(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    with tempfile.TemporaryDirectory(prefix="safeaccess-dp-bench-") as tmp:
        root = Path(tmp) / "data"
        config = initialise(root, server_id="dp-bench")
        data = DataDir(root)
        key = Ed25519PrivateKey.generate()
        census = generate_census(rows, seed=5)
        store = Store(data.database_url(config))
        try:
            store.add_project("bench")
            pub = key.public_key()
            store.add_researcher("r", public_key_text(pub), fingerprint(pub), ["bench"])
            for name in ("census", "census-dp"):
                register_dataset(
                    data,
                    store,
                    name=name,
                    frame=census,
                    metadata=census_metadata(name),
                    project="bench",
                )
            # A budget large enough for every benchmark step.
            store.set_dp_config(
                "census-dp", {"epsilon": 100.0, "delta": 1e-6, "scope": "researcher"}
            )
        finally:
            store.close()
        service = Service(root)
        timings: dict[str, list[float]] = {}
        with service, EmbeddedServer(create_app(service)) as server:
            cases: list[tuple[str, str, Analysis]] = [
                (
                    "rule-checked frequency table",
                    "census",
                    FrequencyTable(rows=["region"], cols=["sex"]),
                ),
                (
                    "DP count (noise + ledger)",
                    "census-dp",
                    DPCount(by=["region", "sex"], sigma=50.0),
                ),
            ]
            for label, dataset, analysis in cases:
                sealed = seal(
                    [to_body(analysis)] * (steps + 1),
                    key,
                    researcher="r",
                    project="bench",
                    dataset=dataset,
                    server=service.server_id,
                )
                with connect(server.url, key, "r") as session:
                    first = session.open(sealed)
                    assert first.released, first.describe()
                    times = []
                    for j in range(2, steps + 2):
                        start = time.perf_counter()
                        result = session.reveal(first.sequence_id, sealed, j)
                        times.append(time.perf_counter() - start)
                        assert result.released, result.describe()
                timings[label] = times
    rule, dp = timings.values()
    print(
        f"server step latency ({rows} records, {steps} steps each, sandbox {service.backend.name}):"
    )
    for label, times in timings.items():
        print(
            f"  {label:32s} median {statistics.median(times) * 1000:8.1f} ms   "
            f"p95 {percentile(times, 0.95) * 1000:8.1f} ms"
        )
    print(
        f"  ratio DP / rule-checked (median): {statistics.median(dp) / statistics.median(rule):.3f}"
    )


def hotelling_level(reps: int) -> None:
    """Rejection rates under H0 of the DP Hotelling test (bootstrap and asymptotic chi2)."""

    def stats_of(data: np.ndarray) -> GroupStatistics:
        cov = np.atleast_2d(np.cov(data, rowvar=False)).tolist()
        return GroupStatistics(n=data.shape[0], mean=data.mean(axis=0).tolist(), covariance=cov)

    root3 = math.sqrt(3.0)
    print(
        f"DP Hotelling under H0 ({reps} replications, B = 200, nominal 5 %; seeded simulation noise)"
    )
    for n, d, eps in [(100, 1, 1.0), (100, 3, 0.5), (1000, 3, 0.1), (2000, 10, 1.0), (200, 5, 1.0)]:
        rng = np.random.default_rng(1)
        mu = gaussian_mu_for(eps, 1e-5)

        def noise(values: np.ndarray, sigma: float, rng: np.random.Generator = rng) -> np.ndarray:
            return np.asarray(values, dtype=float) + rng.normal(0.0, sigma, np.shape(values))

        boot = chi = 0
        for _ in range(reps):
            x = rng.uniform(-root3, root3, (n, d))
            y = rng.uniform(-root3, root3, (n, d))
            release = release_mean_comparison(
                stats_of(x), stats_of(y), [-root3] * d, [root3] * d, mu, noise
            )
            result = hotelling_test(release, bootstrap=200, seed=int(rng.integers(1 << 30)))
            boot += result.reject
            chi += result.chi2_p_value < 0.05
        print(
            f"  n={n:>5} per group, d={d:>2}, eps={eps:>4}: bootstrap {boot / reps:.3f}, "
            f"chi2 {chi / reps:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20, help="calibration repetitions")
    parser.add_argument("--rows", type=int, default=20_000, help="census size for --server")
    parser.add_argument("--steps", type=int, default=15, help="reveals per kind for --server")
    parser.add_argument("--server", action="store_true", help="only the latency through the server")
    parser.add_argument(
        "--hotelling",
        type=int,
        default=0,
        metavar="REPS",
        help="also simulate the DP Hotelling level",
    )
    args = parser.parse_args()
    if args.server:
        server_latency(args.rows, args.steps)
        return
    calibration_time(args.repeats)
    accounting([10, 100, 1000], eps0=0.5, delta0=1e-6, delta=1e-5)
    server_latency(args.rows, args.steps)
    if args.hotelling:
        hotelling_level(args.hotelling)


if __name__ == "__main__":
    main()
