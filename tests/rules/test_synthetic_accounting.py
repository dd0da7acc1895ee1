"""GDP charges of a marginal workload and the MST-G noise split, against hand computation, the
existing ledger, and OpenDP's own privacy map; the noisy total against hand computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from safeaccess.rules.dp.accounting import GaussianLedger
from safeaccess.rules.dp.errors import DPParameterError
from safeaccess.rules.synthetic import mst_sigmas, noisy_total, workload_mu


def test_workload_mu_hand_cases():
    # two marginals, sigma 2 and 4: mu^2 = 1/4 + 1/16
    assert workload_mu([2.0, 4.0]) == pytest.approx(math.sqrt(5 / 16))
    # m = 3 records per unit; the second release moves 5 entries per record:
    # (3*1/2)^2 + (3*sqrt5/4)^2 = 2.25 + 2.8125 = 5.0625
    assert workload_mu([2.0, 4.0], cells_per_record=[1, 5], records_per_unit=3) == pytest.approx(
        2.25
    )
    # K marginals at one sigma charge (m sqrt K / sigma)^2
    assert workload_mu([5.0] * 7, records_per_unit=2) == pytest.approx(2 * math.sqrt(7) / 5)


@pytest.mark.parametrize(("mu", "d", "pairs", "k", "m"), [(1.0, 4, 6, 3, 1), (0.182, 8, 28, 7, 5)])
def test_mst_sigmas_spend_mu_exactly(mu, d, pairs, k, m):
    s1, ss, s2 = mst_sigmas(mu, d, pairs, k, records_per_unit=m)
    # hand: sigma = m sqrt(count) / (mu sqrt(share))
    assert s1 == pytest.approx(m * math.sqrt(d) / (mu * math.sqrt(0.25)))
    assert ss == pytest.approx(m * math.sqrt(pairs) / (mu * math.sqrt(0.10)))
    assert s2 == pytest.approx(m * math.sqrt(k) / (mu * math.sqrt(0.65)))
    sigmas = [s1] * d + [ss] + [s2] * k
    cells = [1] * d + [pairs] + [1] * k
    assert workload_mu(sigmas, cells, records_per_unit=m) == pytest.approx(mu, rel=1e-12)
    # the server's ledger, charged release by release with sensitivity m sqrt(cells), agrees
    ledger = GaussianLedger()
    for sigma, c in zip(sigmas, cells, strict=True):
        ledger = ledger.charge(m * math.sqrt(c), sigma)
    assert ledger.mu == pytest.approx(mu, rel=1e-9)


def test_mst_sigmas_mu_1_hand_values():
    s1, ss, s2 = mst_sigmas(1.0, 4, 6, 3)
    assert s1 == pytest.approx(4.0)  # sqrt(4) / sqrt(0.25)
    assert ss == pytest.approx(math.sqrt(60.0))  # sqrt(6) / sqrt(0.1)
    assert s2 == pytest.approx(math.sqrt(3 / 0.65))


def test_fixed_workload_has_no_selection_release():
    s1, ss, s2 = mst_sigmas(0.5, ["a", "b", "c"], [], [("a", "b")], shares=(0.25, 0.0, 0.75))
    assert math.isinf(ss)
    assert workload_mu([s1] * 3 + [s2]) == pytest.approx(0.5)


def test_opendp_certifies_the_same_charge():
    noise = pytest.importorskip("safeaccess.rules.dp.noise")
    s1, ss, s2 = mst_sigmas(0.6, 3, 3, 2)
    rho = sum(
        count * noise.opendp_rho(math.sqrt(c), sigma)
        for count, c, sigma in ((3, 1, s1), (1, 3, ss), (2, 1, s2))
    )
    # OpenDP's zCDP rho of a Gaussian is mu^2 / 2 (up to its lattice relaxation)
    assert rho == pytest.approx(0.6**2 / 2, rel=1e-6)


def test_bad_accounting_input():
    with pytest.raises(DPParameterError, match="sum to 1"):
        mst_sigmas(1.0, 2, 1, 1, shares=(0.5, 0.5, 0.5))
    with pytest.raises(DPParameterError, match="share of mu\\^2 is 0"):
        mst_sigmas(1.0, 2, 1, 1, shares=(0.5, 0.0, 0.5))
    with pytest.raises(DPParameterError, match="mu must be a finite number > 0"):
        mst_sigmas(0.0, 2, 1, 1)
    with pytest.raises(DPParameterError, match="records_per_unit"):
        workload_mu([1.0], records_per_unit=0)
    with pytest.raises(DPParameterError, match="2 entries but sigmas has 1"):
        workload_mu([1.0], cells_per_record=[1, 1])


def test_noisy_total_hand_cases():
    # equal variances (1 * 2^2 = 4 * 1^2): the plain mean, sd sqrt(4/2)
    total, sd = noisy_total([100.0, 104.0], [1, 4], [2.0, 1.0])
    assert total == pytest.approx(102.0) and sd == pytest.approx(math.sqrt(2))
    # weights 1 and 1/9: (100 + 110/9) / (10/9) = 101, sd = sqrt(9/10)
    total, sd = noisy_total([100.0, 110.0], [1, 1], [1.0, 3.0])
    assert total == pytest.approx(101.0) and sd == pytest.approx(math.sqrt(0.9))
    with pytest.raises(DPParameterError, match="one entry per marginal"):
        noisy_total([1.0], [1, 2], [1.0])


def test_noisy_total_is_unbiased_with_the_stated_sd():
    rng = np.random.default_rng(0)  # test-only simulation noise
    cells, sigmas, n = np.array([5, 12, 30]), np.array([3.0, 2.0, 4.0]), 1000.0
    sums = n + rng.normal(size=(20000, 3)) * np.sqrt(cells) * sigmas
    estimates = [noisy_total(s, cells, sigmas)[0] for s in sums]
    _, sd = noisy_total(sums[0], cells, sigmas)
    assert np.mean(estimates) == pytest.approx(n, abs=4 * sd / math.sqrt(len(estimates)))
    assert np.std(estimates) == pytest.approx(sd, rel=0.03)
