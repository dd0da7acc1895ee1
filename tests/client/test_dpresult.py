"""The client's inference on DP answers: the chi-squared quantile it carries (the client has no
scipy) against scipy, the inversion of transformed answers, the test's decision and power."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from safeaccess.client.dpresult import DPResult, chi2_quantile


@pytest.mark.parametrize("df", [1, 2, 3, 5, 10, 40, 200])
@pytest.mark.parametrize("p", [0.5, 0.9, 0.95, 0.99, 0.999])
def test_chi2_quantile_matches_scipy(df: int, p: float) -> None:
    assert chi2_quantile(p, df) == pytest.approx(stats.chi2.ppf(p, df), rel=1e-9)


def _answer(values: list[float], weights: list[float] | None, sigma: float, **kw: object) -> dict:
    return {
        "type": "dp_answer",
        "kind": "dp_count",
        "by": ["g"],
        "groups": [[i] for i in range(len(values))],
        "components": ["count"],
        "values": [[v] for v in values],
        "sigma": sigma,
        "sensitivity": 1.0,
        "weights": weights,
        "ledger": {},
        "risk": {},
        **kw,
    }


def test_inversion_divides_out_the_weights() -> None:
    dp = DPResult(_answer([2.0, 3.0], [4.0, 0.25], sigma=1.0))
    assert dp.estimates() == [[1.0], [6.0]]
    assert dp.standard_errors() == [[0.5], [2.0]]


def test_region_covers_at_its_level_in_simulation() -> None:
    rng = np.random.default_rng(1)
    truth = np.array([10.0, -3.0, 5.0])
    weights = np.array([1.0, 4.0, 0.5])
    sigma = 2.0
    hits = 0
    trials = 4000
    for _ in range(trials):
        y = np.sqrt(weights) * truth + rng.normal(0, sigma, 3)
        region = DPResult(_answer(list(y), list(weights), sigma)).confidence_region(0.1)
        hits += region.contains(list(truth))
    assert abs(hits / trials - 0.9) < 0.02
    # Semi-axes: sigma sqrt(q / w) with q the chi2(3) 0.9 quantile.
    q = stats.chi2.ppf(0.9, 3)
    assert region.semi_axes == pytest.approx(list(sigma * np.sqrt(q / weights)), rel=1e-9)


def test_planned_test_decision_and_power() -> None:
    eta = [0.0, 3.0]
    transform = {"goal": "test", "eta": eta, "null": [1.0, 1.0], "alpha": 0.05}
    # All weight on component 1 (weight 2): y1 = sqrt(2) * f1 + noise.
    sigma = 1.0
    y1 = math.sqrt(2) * 1.0 + 2.0  # 2 sigma above the null
    dp = DPResult(_answer([0.3, y1], [0.0, 2.0], sigma, transform=transform))
    t = dp.test()
    assert t.statistic == pytest.approx(2.0 / sigma)
    assert t.critical == pytest.approx(stats.norm.ppf(0.95))
    assert t.reject  # 2.0 > 1.645
    assert t.power == pytest.approx(
        stats.norm.cdf(math.sqrt(2) * 3.0 / sigma - stats.norm.ppf(0.95))
    )


def test_means_divide_centred_sums_by_the_count() -> None:
    out = _answer([0.0], None, 1.0)
    out.update(
        kind="dp_mean",
        components=["sum(x - 5)", "count"],
        values=[[20.0, 10.0]],
        groups=[[]],
        by=[],
        centres=[5.0, 0.0],
    )
    (row,) = DPResult(out).means()
    assert row["variable"] == "x"
    assert row["mean"] == pytest.approx(7.0)
    assert row["std_error"] == pytest.approx(math.sqrt(1 / 100 + 400 / 10**4))


def _mean_answer() -> dict[str, Any]:
    return {
        "type": "dp_answer",
        "kind": "dp_mean",
        "sigma": 10.0,
        "sensitivity": 5.0,
        "by": ["sex"],
        "groups": [["F"], ["M"]],
        "components": ["sum(x - 5)", "count", "missing"],
        # The transformed answer sqrt(w) f: estimates S = 100, n = 50, missing 3 (F)
        "values": [[100.0, 500.0, 30.0], [-40.0, -20.0, 5.0]],
        "centres": [5.0, 0.0, 0.0],
        "weights": [1.0, 100.0, 100.0] * 2,
        "noise_sd": [[10.0, 1.0, 1.0], [10.0, 1.0, 1.0]],
        "ledger": {
            "scope": "researcher",
            "epsilon_spent": 1.0,
            "epsilon_budget": 2.0,
            "delta": 1e-6,
            "releases": 1,
            "mu_remaining": 0.3,
        },
        "risk": {"tpr_at_fpr": {"0.05": 0.1}, "auc": 0.6},
    }


def test_mean_standard_error_carries_the_noise_of_the_sum_and_of_the_count() -> None:
    dp = DPResult(_mean_answer())
    assert dp.standard_errors()[0] == [10.0, 1.0, 1.0]  # the released noise_sd, per component
    f, m = dp.means()
    # Delta method for c + S / n: Var = sd_S^2 / n^2 + S^2 sd_n^2 / n^4 (S = 100, n = 50).
    assert f["mean"] == pytest.approx(5.0 + 100.0 / 50.0)
    assert f["std_error"] == pytest.approx(math.sqrt(100 / 50**2 + 100**2 / 50**4), rel=1e-12)
    assert (f["count"], f["missing"]) == (50.0, 3.0)
    # A noisy count that is not positive gives no mean, not a wild one.
    assert m["mean"] is None and m["std_error"] is None


def test_the_card_shows_the_means_with_their_counts() -> None:
    from safeaccess.client.notebook import dp_html

    html = dp_html(DPResult(_mean_answer()))
    assert "<td>7 ± 0.204</td><td>50</td><td>3</td>" in html
    assert "left out (missing)" in html


def _step(output: dict[str, Any]) -> Any:
    from safeaccess.client.results import StepResult

    return StepResult.from_json(
        {"sequence_id": "s", "index": 1, "state": "released", "last": True, "output": output}
    )


def test_a_dp_mean_plots_its_means_with_their_standard_errors_not_the_sums() -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = _mean_answer()
    # Both groups with a positive noisy count: F has S = 100, n = 50; M has S = -40, n = 20.
    out["values"][1] = [-40.0, 200.0, 50.0]
    ax = _step(out).plot()
    heights = [p.get_height() for p in ax.patches]
    # The released means c + S / n (hand-computed), not the noisy sums 100, -40 or counts 50, 20.
    assert heights == pytest.approx([5.0 + 100.0 / 50.0, 5.0 - 40.0 / 20.0])
    assert heights == pytest.approx([r["mean"] for r in DPResult(out).means()])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["x"]
    assert ax.get_ylabel() == "mean"
    # Whiskers: ±1.96 delta-method standard errors, sqrt(sd_S^2 / n^2 + S^2 sd_n^2 / n^4).
    half = []
    for bars in (c for c in ax.containers if hasattr(c, "errorbar")):  # bars, not their whiskers
        (segment,) = bars.errorbar.lines[2][0].get_segments()
        half.append((segment[1][1] - segment[0][1]) / 2)
    assert half == pytest.approx(
        [
            1.959963984540054 * math.sqrt(100 / 50**2 + 100**2 / 50**4),
            1.959963984540054 * math.sqrt(100 / 20**2 + 40**2 / 20**4),
        ]
    )
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["F", "M"]
    plt.close("all")


def test_a_dp_mean_without_a_positive_count_draws_no_bar() -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = _step(_mean_answer()).plot()  # M's noisy count is -2: no mean was released for it
    heights = [p.get_height() for p in ax.patches]
    assert heights[0] == pytest.approx(7.0) and math.isnan(heights[1])
    plt.close("all")


def test_a_dp_sum_plots_its_noisy_estimates_plainly() -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = _answer([120.0, 30.0], None, 2.0)
    out.update(kind="dp_sum", components=["sum(income)"], groups=[["F"], ["M"]])
    ax = _step(out).plot()
    assert [p.get_height() for p in ax.patches] == [120.0, 30.0]
    plt.close("all")
