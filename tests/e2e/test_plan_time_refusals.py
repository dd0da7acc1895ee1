"""What the analysis alone dooms is refused at plan time, through the real server and client:
histogram bins without declared bounds, DP requests past the remaining budget (with the remaining
epsilon named), and the budgets a researcher can ask for and read in the catalogue."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import make_centre, serving, set_dp

from safeaccess.client.analyses import Histogram
from safeaccess.client.session import connect
from safeaccess.client.validation import AnalysisInvalid
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.service import Service


@dataclass
class Running:
    service: Service
    url: str
    key: Ed25519PrivateKey


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root: Path = tmp_path_factory.mktemp("plantime") / "data"
    key = Ed25519PrivateKey.generate()
    census = generate_census(2000, seed=5)
    unbounded = census_metadata("unbounded")
    unbounded = unbounded.model_copy(
        update={
            "columns": [
                c.model_copy(update={"bounds": None}) if c.name == "income" else c
                for c in unbounded.columns
            ]
        }
    )
    datasets = {
        "census": (census, census_metadata("census")),
        "unbounded": (census, unbounded),
        "dpcensus": (census, census_metadata("dpcensus")),
    }
    make_centre(root, "plan-time", {"ada": key}, datasets)
    set_dp(root, "dpcensus", "1", "1e-5")
    with serving(root) as (service, srv):
        yield Running(service, srv.url, key)


def test_histogram_bins_take_edges_from_declared_bounds_or_are_refused(running: Running) -> None:
    with connect(running.url, running.key, "ada") as session:
        plan = session.plan("census").histogram("age", bins=5)
        edges = plan.analyses[0].model_dump()["edges"]
        assert edges == pytest.approx(list(np.linspace(16, 95, 6)))
        assert plan.analyses[0].model_dump()["bins"] is None
        results = session.run(session.seal(plan))
        assert results[0].released, results[0].describe()
        assert all(r.check != "bin_edges" for r in results[0].reasons)

        unbounded = session.plan("unbounded")
        with pytest.raises(AnalysisInvalid, match="minimum and maximum") as info:
            unbounded.histogram("income", bins=10)
        assert info.value.problems[0].field == "bins"
        with pytest.raises(AnalysisInvalid, match="give edges"):
            unbounded.add(Histogram(variable="income", bins=10))
        assert len(unbounded) == 0
        unbounded.histogram("income", edges=[0, 50_000, 100_000, 10_000_000])
        assert len(unbounded) == 1


def test_dp_requests_past_the_budget_are_refused_before_sealing(running: Running) -> None:
    before = len(running.service.store.list_sequences("ada"))
    with connect(running.url, running.key, "ada") as session:
        budgets = session.budgets("dpcensus")
        assert budgets.dp is not None and budgets.withhold is not None
        assert budgets.dp.epsilon == 1 and budgets.dp.epsilon_spent == 0
        assert budgets.dp.epsilon_remaining == pytest.approx(1, rel=1e-6)
        assert budgets.withhold.remaining == budgets.withhold.count == 25
        assert session.budgets("census").dp is None

        # Each request fits alone; together they do not: the second is named.
        plan = session.plan("dpcensus").dp_count(epsilon=0.8, delta=1e-5)
        plan.dp_count(by="sex", epsilon=0.8, delta=1e-5)
        with pytest.raises(AnalysisInvalid) as info:
            session.seal(plan)
        [problem] = info.value.problems
        assert problem.field == "analyses[1]"
        assert "dp_count" in problem.message and "1 DP request(s) before it" in problem.message
        assert len(running.service.store.list_sequences("ada")) == before

        # One request fits: it is sealed, answered and charged; the catalogue shows the rest.
        one = session.plan("dpcensus").dp_count(epsilon=0.8, delta=1e-5)
        after = session.check_plan(one)
        assert after is not None and 0 < after.epsilon_remaining < 0.8
        results = session.run(session.seal(one))
        assert results[0].released, results[0].describe()
        dp = results[0].dp
        assert dp is not None and 'data-safeaccess="dp"' in dp._repr_html_()
        assert "sigma" in dp._repr_html_() or "σ" in dp._repr_html_()
        assert list(results[0].frame().columns) == ["count", "se count"]
        now = session.budgets("dpcensus").dp
        assert now is not None and now.releases == 1
        assert now.epsilon_remaining == pytest.approx(after.epsilon_remaining, rel=1e-9)
        assert now.epsilon_spent == pytest.approx(0.8, rel=1e-3)
        assert f"{now.epsilon_remaining:.4g}" in str(now)

        again = session.plan("dpcensus").dp_count(epsilon=0.8, delta=1e-5)
        with pytest.raises(AnalysisInvalid, match=r"only .* remains") as info:
            session.seal(again)
        assert f"at most ε = {now.epsilon_remaining:.4g} at δ = 1e-05" in str(info.value)
    # Nothing was charged for the refusals and no sequence was opened for them.
    assert len(running.service.store.list_sequences("ada")) == before + 1


def test_a_dp_histogram_plots_its_noisy_counts_with_intervals(running: Running) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with connect(running.url, running.key, "ada") as session:
        plan = session.plan("dpcensus").dp_histogram("age", [16, 40, 65, 95], sigma=200.0)
        (result,) = session.run(session.seal(plan))
    assert result.released, result.describe()
    dp = result.dp
    assert dp is not None
    ax = result.plot()
    assert [p.get_height() for p in ax.patches] == pytest.approx(dp.estimates()[0])
    assert [t.get_text() for t in ax.get_xticklabels()] == dp.components
    # The whiskers are ±1.96 released standard errors.
    bars = ax.containers[-1]  # the bars (the error bars are a container of their own)
    assert bars.errorbar is not None
    segments = bars.errorbar.lines[2][0].get_segments()
    half = [(seg[1][1] - seg[0][1]) / 2 for seg in segments]
    assert half == pytest.approx([1.959963984540054 * s for s in dp.standard_errors()[0]])
    plt.close("all")


def test_a_dp_mean_test_has_a_one_row_frame_of_its_result(running: Running) -> None:
    with connect(running.url, running.key, "ada") as session:
        plan = session.plan("dpcensus").dp_mean_test("income", "sex", epsilon=0.2, delta=1e-5)
        (result,) = session.run(session.seal(plan))
    assert result.released, result.describe()
    assert result.output is not None and result.output["test"]
    frame = result.frame()
    assert frame.shape[0] == 1
    assert frame.iloc[0].to_dict() == result.output["test"]
