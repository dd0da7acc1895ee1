"""Differential privacy through the real server, client and process sandbox.

Expected figures come from outside the code under test: the analytic Gaussian reference
sigma/Delta = 3.7306316348 at (epsilon, delta) = (1, 1e-5) (Balle & Wang; issue 11), sensitivities
worked out by hand from the declared bounds, and the true statistics computed here with pandas.
"""

from __future__ import annotations

import math
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import centre_store, free_port, make_centre, serve_in_subprocess, serving, set_dp
from sqlalchemy import select

from safeaccess.client.analyses import (
    Analysis,
    DPCount,
    DPHistogram,
    DPMean,
    DPMeanTest,
    DPSum,
    FrequencyTable,
    to_body,
)
from safeaccess.client.protocol import SealedSequence, canonical, seal
from safeaccess.client.results import StepResult
from safeaccess.client.session import ServerError, connect
from safeaccess.rules.dp.transform import confidence_region, likelihood_ratio_test, power
from safeaccess.server.admin.cli import main as admin
from safeaccess.server.config import DataDir
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store import Store
from safeaccess.server.store.schema import EventRow

# sigma / Delta of the analytic Gaussian mechanism at (1, 1e-5): the reference value.
SIGMA_RATIO_1_1E5 = 3.7306316348
BUDGET_MU2 = 1.0 / SIGMA_RATIO_1_1E5**2  # the (1, 1e-5) budget as a sum of (Delta/sigma)^2
ROWS = 2000


@dataclass
class DPCentre:
    root: Path
    server_id: str
    keys: dict[str, Ed25519PrivateKey]
    census: pd.DataFrame

    def seal(
        self, analyses: list[Analysis], *, dataset: str, researcher: str = "ada"
    ) -> SealedSequence:
        return seal(
            [to_body(a) for a in analyses],
            self.keys[researcher],
            researcher=researcher,
            project="p1",
            dataset=dataset,
            server=self.server_id,
        )


@pytest.fixture(scope="module")
def centre(tmp_path_factory: pytest.TempPathFactory) -> DPCentre:
    root = tmp_path_factory.mktemp("dpcentre") / "data"
    keys = {name: Ed25519PrivateKey.generate() for name in ("ada", "bob")}
    census = generate_census(ROWS, seed=11)
    names = ("dpcensus", "dpbudget", "dpcrash", "dpmandatory", "dppolicy", "plain")
    datasets = {name: (census, census_metadata(name)) for name in names}
    config = make_centre(root, "dp-centre", keys, datasets)
    # Generous budget for the shape tests; (1, 1e-5) per researcher for the budget tests.
    set_dp(root, "dpcensus", "50", "1e-5")
    set_dp(root, "dpbudget", "1", "1e-5")
    set_dp(root, "dpcrash", "1", "1e-5", "--scope", "dataset")
    set_dp(root, "dpmandatory", "5", "1e-5", "--mandatory")
    set_dp(root, "dppolicy", "50", "1e-5", "--max-tpr-at-5pct", "0.2")
    return DPCentre(root=root, server_id=config.server_id, keys=keys, census=census)


@pytest.fixture(scope="module")
def server(centre: DPCentre) -> Iterator[tuple[Service, EmbeddedServer]]:
    with serving(centre.root) as (service, srv):
        yield service, srv


def _run(
    server: tuple[Service, EmbeddedServer], centre: DPCentre, sealed: SealedSequence, who: str
) -> list[StepResult]:
    with connect(server[1].url, centre.keys[who], who) as session:
        return session.run(sealed)


def _ledger(centre: DPCentre, key: str) -> tuple[float, int]:
    with centre_store(centre.root) as store:
        state = store.dp_ledger(key)
        return state.spent, state.releases


# --------------------------------------------------------------------------- kinds and shapes


def test_each_dp_kind_answers_with_its_sigma_sensitivity_and_shape(
    server: tuple[Service, EmbeddedServer], centre: DPCentre
) -> None:
    census = centre.census
    hist_edges = [16.0, 30.0, 50.0, 70.0, 95.0]
    analyses: list[Analysis] = [
        DPCount(by=["region"], epsilon=1.0, delta=1e-5),
        DPSum(variable="income", sigma=1_000_000.0),
        DPMean(variables=["age", "income"], by=["sex"], epsilon=2.0, delta=1e-5),
        DPHistogram(variable="age", edges=hist_edges, by=["sex"], sigma=3.0),
    ]
    results = _run(server, centre, centre.seal(analyses, dataset="dpcensus"), "ada")
    assert [r.status for r in results] == ["released"] * 4

    count = results[0].dp
    assert count is not None
    assert count.sensitivity == 1.0
    assert count.sigma == pytest.approx(SIGMA_RATIO_1_1E5, rel=1e-9)
    assert count.sigma >= SIGMA_RATIO_1_1E5 * (1 - 1e-10)  # rounded on the safe side
    assert [g[0] for g in count.groups] == census_metadata().column("region").levels  # type: ignore[union-attr]
    truth = census["region"].value_counts()
    for (level,), (value,) in zip(count.groups, count.values, strict=True):
        assert abs(value - truth.get(level, 0)) < 6 * count.sigma

    total = results[1].dp
    assert total is not None
    assert total.sigma == 1_000_000.0
    assert total.sensitivity == 2_000_000.0  # max(|0|, |2e6|), income's declared bounds
    assert abs(total.values[0][0] - census["income"].clip(0, 2e6).sum()) < 6 * 1_000_000

    mean = results[2].dp
    assert mean is not None
    # (95 - 16) / 2 for age, (2e6 - 0) / 2 for income, 1 for the count, one group per record.
    assert mean.sensitivity == pytest.approx(math.sqrt(39.5**2 + 1e6**2 + 1), rel=1e-12)
    # At epsilon 2 the noise is below the (1, 1e-5) calibration and above half of it.
    assert 0.5 * SIGMA_RATIO_1_1E5 < mean.sigma / mean.sensitivity < SIGMA_RATIO_1_1E5
    assert mean.groups == [["F"], ["M"]]
    assert mean.components == ["sum(age - 55.5)", "sum(income - 1e+06)", "count", "missing"]
    assert results[2].output is not None and results[2].output["centres"][:2] == [55.5, 1e6]
    # The default split for the means: equal shares of mu^2 for the two sums, sqrt(2) shares
    # for the count (C / (2 + sqrt 2) each), and the missing count the whole block's, so each
    # component's noise is sigma / sqrt(xi) and the count is not buried under income's sigma.
    c = 39.5**2 + 1e6**2 + 1
    share = c / (2 + math.sqrt(2))
    xi = [share / 39.5**2, share / 1e6**2, math.sqrt(2) * share, c]
    assert mean.weights == pytest.approx(xi * 2, rel=1e-12)
    sds = mean.standard_errors()
    assert sds[0] == pytest.approx([mean.sigma / math.sqrt(w) for w in xi], rel=1e-12)
    assert sds[0][2] < 10  # records, at epsilon 2
    for row in mean.means():
        truth = census.loc[census["sex"] == row["group"][0], ["age", "income"]].dropna()
        v = row["variable"]
        assert abs(row["mean"] - truth[v].clip(*((16, 95) if v == "age" else (0, 2e6))).mean()) < (
            5 * row["std_error"]
        )

    hist = results[3].dp
    assert hist is not None
    assert hist.sensitivity == 1.0  # one record lies in one bin of one group
    assert hist.sigma == 3.0
    assert len(hist.values) == 2 and all(len(row) == 5 for row in hist.values)  # 4 bins, missing
    for g, (sex,) in enumerate(hist.groups):
        ages = census.loc[census["sex"] == sex, "age"]
        counts, _ = np.histogram(ages.dropna().clip(16, 95), bins=hist_edges)
        truth = [*counts, int(ages.isna().sum())]
        assert np.all(np.abs(np.array(hist.values[g]) - truth) < 6 * 3.0)

    # Each answer carries the ledger and the risk report; the ledger grows release by release.
    spent = [r.dp.ledger["epsilon_spent"] for r in results if r.dp is not None]
    assert spent == sorted(spent) and spent[0] > 0
    assert results[-1].dp is not None and results[-1].dp.ledger["releases"] == 4
    risk = count.risk
    assert set(risk["tpr_at_fpr"]) == {"0.01", "0.05", "0.1"}
    from statistics import NormalDist

    nd = NormalDist()
    mu = 1.0 / count.sigma
    assert risk["tpr_at_fpr"]["0.05"] == pytest.approx(nd.cdf(nd.inv_cdf(0.05) + mu), rel=1e-9)
    assert risk["auc"] == pytest.approx(nd.cdf(mu / math.sqrt(2)), rel=1e-9)


def test_dp_step_facts_are_in_the_event_log(
    server: tuple[Service, EmbeddedServer], centre: DPCentre
) -> None:
    results = _run(
        server,
        centre,
        centre.seal([DPCount(sigma=10.0)], dataset="dpcensus", researcher="bob"),
        "bob",
    )
    assert results[0].released
    service = server[0]
    with service.store.transaction() as s:
        events = list(
            s.scalars(
                select(EventRow).where(
                    EventRow.sequence_id == results[0].sequence_id, EventRow.kind == "checks"
                )
            )
        )
    facts = events[0].data["dp"]
    assert facts["sigma"] == 10.0 and facts["sensitivity"] == 1.0
    assert facts["charge"] == pytest.approx(0.01, rel=1e-12)
    assert facts["ledger"] == "dpcensus|researcher|bob"
    assert facts["verdict"] == "release"  # the audit's convention for a feature's facts


# --------------------------------------------------------------------------------- the budget


def _remaining_in(message: str) -> float:
    found = re.search(r"only ([0-9.e+-]+) remains", message)
    assert found, message
    return float(found.group(1))


def test_budget_is_enforced_per_researcher_and_survives_a_restart(
    server: tuple[Service, EmbeddedServer], centre: DPCentre
) -> None:
    # Budget (1, 1e-5): (Delta/sigma)^2 may add up to BUDGET_MU2 = 0.0718545...
    first = _run(server, centre, centre.seal([DPCount(sigma=5.0)], dataset="dpbudget"), "ada")
    assert first[0].released  # 0.04 spent
    second = _run(server, centre, centre.seal([DPCount(sigma=5.0)], dataset="dpbudget"), "ada")
    assert second[0].withheld  # 0.04 more does not fit
    (reason,) = second[0].reasons
    assert reason.check == "dp_budget"
    assert _remaining_in(reason.message) == pytest.approx(BUDGET_MU2 - 0.04, rel=1e-5)
    assert _ledger(centre, "dpbudget|researcher|ada") == (pytest.approx(0.04), 1)
    # Bob's ledger is his own.
    other = _run(
        server,
        centre,
        centre.seal([DPCount(sigma=5.0)], dataset="dpbudget", researcher="bob"),
        "bob",
    )
    assert other[0].released
    # A fresh server process reads the same ledger: the budget is persistent.
    again = Service(centre.root)
    try:
        with EmbeddedServer(create_app(again)) as srv:
            fresh = _run(
                (again, srv), centre, centre.seal([DPCount(sigma=5.0)], dataset="dpbudget"), "ada"
            )
            assert fresh[0].withheld
            fits = _run(
                (again, srv), centre, centre.seal([DPCount(sigma=6.0)], dataset="dpbudget"), "ada"
            )
            assert fits[0].released  # 1/36 = 0.0278 < 0.0319 still fits
            assert fits[0].dp is not None
            assert fits[0].dp.ledger["epsilon_spent"] <= 1.0
    finally:
        again.close()
    assert _ledger(centre, "dpbudget|researcher|ada")[1] == 2


def test_a_rerun_after_the_answer_was_recorded_returns_the_stored_answer(
    server: tuple[Service, EmbeddedServer], centre: DPCentre
) -> None:
    service, srv = server
    sealed = centre.seal([DPCount(by=["sex"], sigma=40.0)], dataset="dpcensus", researcher="bob")
    real_view = service.views.step
    calls = {"n": 0}

    def dies_after_recording(seq, step):  # type: ignore[no-untyped-def]
        # The outcome and its charge are committed; the response never leaves (as if the
        # process died here).
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("server died after recording the step")
        return real_view(seq, step)

    key = "dpcensus|researcher|bob"
    before = _ledger(centre, key)
    service.views.step = dies_after_recording  # type: ignore[method-assign]
    try:
        with (
            connect(srv.url, centre.keys["bob"], "bob", retries=0) as session,
            pytest.raises(ServerError),
        ):
            session.open(sealed)
    finally:
        service.views.step = real_view  # type: ignore[method-assign]
    after_charge = _ledger(centre, key)
    assert after_charge[1] == before[1] + 1
    with connect(srv.url, centre.keys["bob"], "bob") as session:
        found = session.find(sealed)
        assert found is not None
        first = session.step(found["id"], 1)
        again = session.reveal(found["id"], sealed, 1)
    assert first.released and first.output == again.output
    assert _ledger(centre, key) == after_charge  # no second charge, no fresh noise


@pytest.mark.slow
def test_server_killed_mid_dp_step_charges_once_after_restart(centre: DPCentre) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sealed = centre.seal(
        [DPCount(sigma=20.0), DPCount(by=["sex"], sigma=20.0), DPCount(sigma=20.0)],
        dataset="dpcrash",
    )
    proc = serve_in_subprocess(centre.root, port)
    results: list[StepResult] = []
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            with connect(url, centre.keys["ada"], "ada", retries=120, retry_wait=0.5) as s:
                results.extend(s.run(sealed))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    data = DataDir(centre.root)
    watcher = Store(data.database_url(data.load_config()))  # one connection: poll quickly
    first_body = sealed.reveal_for(1)[1]

    def step_state(index: int) -> str | None:
        for seq in reversed(watcher.list_sequences("ada")):
            step = watcher.get_step(seq.id, 1)
            if step is not None and step.body == first_body:
                second = watcher.get_step(seq.id, index)
                return second.state if second else None
        return None

    try:
        driver = threading.Thread(target=drive)
        driver.start()
        deadline = time.monotonic() + 60
        while step_state(2) != "running":
            assert time.monotonic() < deadline, "step 2 never started"
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc = serve_in_subprocess(centre.root, port)
        driver.join(timeout=120)
    finally:
        watcher.close()
        proc.kill()
        proc.wait()
    assert not errors, errors
    assert [r.status for r in results] == ["released"] * 3
    spent, releases = _ledger(centre, "dpcrash|dataset|dpcrash")
    assert releases == 3
    assert spent == pytest.approx(3 * (1 / 20) ** 2, rel=1e-9)


# ------------------------------------------------------------------------------ configuration


def test_mandatory_dp_refuses_rule_checked_kinds(
    server: tuple[Service, EmbeddedServer], centre: DPCentre
) -> None:
    results = _run(
        server, centre, centre.seal([FrequencyTable(rows=["region"])], dataset="dpmandatory"), "ada"
    )
    assert results[0].failed
    assert results[0].error_code == "dp_required"
    assert "only differentially private kinds" in (results[0].error_message or "")
    ok = _run(server, centre, centre.seal([DPCount(sigma=30.0)], dataset="dpmandatory"), "ada")
    assert ok[0].released


def test_dp_kind_on_a_dataset_without_dp_is_refused(
    server: tuple[Service, EmbeddedServer], centre: DPCentre
) -> None:
    results = _run(server, centre, centre.seal([DPCount(sigma=30.0)], dataset="plain"), "ada")
    assert results[0].failed and results[0].error_code == "dp_not_enabled"
    rules = _run(
        server, centre, centre.seal([FrequencyTable(rows=["sex"])], dataset="plain"), "ada"
    )
    assert rules[0].released
    # The catalogue tells the researcher which datasets answer DP kinds, and how.
    with connect(server[1].url, centre.keys["ada"], "ada") as session:
        entries = {d["name"]: d for d in session.datasets()}
    assert entries["plain"]["dp"] is None
    assert entries["dpmandatory"]["dp"]["mandatory"] is True
    assert entries["dpcensus"]["dp"]["epsilon"] == 50.0
    assert entries["dpcensus"]["neighbours"] == {"unit": "record", "max_records_per_unit": 1}


def test_policy_limit_on_attacker_tpr_withholds_revealing_requests(
    server: tuple[Service, EmbeddedServer], centre: DPCentre
) -> None:
    # Delta/sigma = 1: TPR at FPR 0.05 is Phi(-1.645 + 1) = 0.26 > 0.2 allowed.
    loud = _run(server, centre, centre.seal([DPCount(sigma=1.0)], dataset="dppolicy"), "ada")
    assert loud[0].withheld and loud[0].reasons[0].check == "dp_policy"
    assert "0.2" in loud[0].reasons[0].message
    # Delta/sigma = 0.5: Phi(-1.645 + 0.5) = 0.126, allowed.
    quiet = _run(server, centre, centre.seal([DPCount(sigma=2.0)], dataset="dppolicy"), "ada")
    assert quiet[0].released


def test_budget_command_reports_each_ledger(
    server: tuple[Service, EmbeddedServer], centre: DPCentre, capsys: pytest.CaptureFixture[str]
) -> None:
    sealed = centre.seal([DPCount(sigma=100.0)], dataset="dppolicy", researcher="bob")
    assert _run(server, centre, sealed, "bob")[0].released
    assert admin(["dataset", "budget", "dppolicy", "--data-dir", str(centre.root)]) == 0
    text = capsys.readouterr().out
    assert "epsilon=50 at delta=1e-05 per researcher" in text
    line = next(row for row in text.splitlines() if "researcher bob:" in row)
    # One release of Delta/sigma = 1/100: sum (Delta/sigma)^2 = 1e-4.
    assert "1 releases" in line and "= 0.0001" in line


def test_dp_configuration_errors_change_nothing(centre: DPCentre) -> None:
    d = ["--data-dir", str(centre.root)]
    assert admin(["dataset", "dp", "dpcensus", "--epsilon", "-1", "--delta", "1e-5", *d]) == 2
    assert admin(["dataset", "dp", "dpcensus", "--epsilon", "1", "--delta", "2", *d]) == 2
    assert admin(["dataset", "dp", "nosuch", "--epsilon", "1", "--delta", "1e-5", *d]) == 2
    with centre_store(centre.root) as store:
        assert store.get_dp_config("dpcensus") == {
            "epsilon": 50.0,
            "delta": 1e-5,
            "scope": "researcher",
            "mandatory": False,
            "max_tpr_at_5pct": None,
        }
    # Charged per researcher already: switching to one shared ledger would forget that.
    assert (
        admin(
            [
                "dataset",
                "dp",
                "dpbudget",
                "--epsilon",
                "1",
                "--delta",
                "1e-5",
                "--scope",
                "dataset",
                *d,
            ]
        )
        == 2
    )


# ---------------------------------------------------------------------- transformed queries


def test_region_transformation_is_inverted_by_the_client_and_is_smaller(
    server: tuple[Service, EmbeddedServer], centre: DPCentre
) -> None:
    # Two variables: the default split favours the count (sqrt 2 shares), the region equal ones.
    plain = DPMean(variables=["age", "income"], epsilon=1.0, delta=1e-5)
    shaped = DPMean(
        variables=["age", "income"], epsilon=1.0, delta=1e-5, transform={"goal": "region"}
    )
    results = _run(server, centre, centre.seal([plain, shaped], dataset="dpcensus"), "ada")
    assert [r.status for r in results] == ["released", "released"]
    a, b = results[0].dp, results[1].dp
    assert a is not None and b is not None and b.weights is not None and a.weights is not None
    assert a.weights != b.weights  # the default split for the mean, against the region's
    # Both answer at (1, 1e-5): sigma is the reference ratio times each query's sensitivity.
    assert a.sigma == pytest.approx(SIGMA_RATIO_1_1E5 * a.sensitivity, rel=1e-9)
    assert b.sigma == pytest.approx(SIGMA_RATIO_1_1E5 * b.sensitivity, rel=1e-9)
    # The client divides the weights out: estimates of the same statistic agree within noise.
    ea, eb = a.estimates()[0], b.estimates()[0]
    sa, sb = a.standard_errors()[0], b.standard_errors()[0]
    for x, y, u, v in zip(ea, eb, sa, sb, strict=True):
        assert abs(x - y) < 6 * math.hypot(u, v)
    # The client's light inversion agrees with the server-side maths (safeaccess.rules.dp).
    reference = confidence_region(b.flat, b.weights, b.sigma, level=0.95)
    mine = b.confidence_region(0.05)
    assert mine.centre == pytest.approx(reference.estimate, rel=1e-12)
    assert mine.semi_axes == pytest.approx(reference.semi_axes, rel=1e-9)
    # At equal (epsilon, delta) the transformed region has the smaller volume.
    assert b.confidence_region(0.05).log_volume_factor < a.confidence_region(0.05).log_volume_factor
    truth_n = len(centre.census)
    at = b.components.index("count")
    assert abs(eb[at] - truth_n) < 6 * sb[at]


def test_test_transformation_gives_the_decision_and_power(
    server: tuple[Service, EmbeddedServer], centre: DPCentre
) -> None:
    # Per-group counts by sex; the alternative moves the "M" count only.
    eta = [0.0, 200.0]
    null = [0.0, 0.0]
    analysis = DPCount(
        by=["sex"],
        epsilon=1.0,
        delta=1e-5,
        transform={"goal": "test", "eta": eta, "null": null, "alpha": 0.05},
    )
    (result,) = _run(server, centre, centre.seal([analysis], dataset="dpcensus"), "ada")
    dp = result.dp
    assert dp is not None and dp.weights is not None
    assert dp.weights[0] == 0.0 and dp.weights[1] > 0  # all weight where eta is
    t = dp.test()
    assert t.reject  # about a thousand men against a null of none
    reference = likelihood_ratio_test(dp.flat, dp.weights, eta, dp.sigma, alpha=0.05)
    assert t.statistic == pytest.approx(reference.statistic, rel=1e-12)
    assert t.reject == reference.reject
    assert t.power == pytest.approx(power(dp.weights, eta, dp.sigma, 0.05), rel=1e-12)
    from statistics import NormalDist

    nd = NormalDist()
    norm = math.sqrt(dp.weights[1]) * 200.0
    assert t.power == pytest.approx(nd.cdf(norm / dp.sigma - nd.inv_cdf(0.95)), rel=1e-12)


# ----------------------------------------------------------------------------- DP Hotelling


def test_dp_mean_test_answers_the_privatised_hotelling_test(
    server: tuple[Service, EmbeddedServer], centre: DPCentre
) -> None:
    key = "dpcensus|researcher|bob"
    before, releases = _ledger(centre, key)
    # Age differs little between the sexes, income by about 12 % among the employed.
    analysis = DPMeanTest(
        variables=["age", "income"], group="sex", epsilon=1.0, delta=1e-5, alpha=0.05
    )
    sealed = centre.seal([analysis], dataset="dpcensus", researcher="bob")
    (result,) = _run(server, centre, sealed, "bob")
    assert result.released
    dp = result.dp
    assert dp is not None and dp.kind == "dp_mean_test"
    assert dp.groups == [["F"], ["M"]]
    assert dp.components == ["sum(age - 55.5)", "sum(income - 1e+06)", "count"]
    test = result.output["test"] if result.output else {}
    # Each statistic's standard error is the noise it was given (its share of mu^2), not sigma.
    assert dp.standard_errors() == [[test["sigma_sum"]] * 2 + [test["sigma_count"]]] * 2
    assert test["sigma_count"] != dp.sigma
    assert set(test) >= {"statistic", "critical_value", "p_value", "reject", "means"}
    assert 0.0 < test["p_value"] <= 1.0
    assert test["reject"] == (test["statistic"] > test["critical_value"])
    # One mu-GDP release at (1, 1e-5): the ledger is charged mu^2 with mu = 1 / 3.7306...
    spent, count = _ledger(centre, key)
    assert count == releases + 1
    assert spent - before == pytest.approx(BUDGET_MU2, rel=1e-8)
    # Noisy group sizes near the truth.
    truth = centre.census["sex"].value_counts()
    for (sex,), row in zip(dp.groups, dp.values, strict=True):
        assert abs(row[-1] - truth[sex]) < 6 * test["sigma_count"]


def test_dp_mean_test_refuses_sigma(
    server: tuple[Service, EmbeddedServer], centre: DPCentre
) -> None:
    # Refused when the plan is written ...
    with pytest.raises(ValueError, match="'sigma' is not used by dp_mean_test"):
        DPMeanTest(variables=["age"], group="sex", sigma=5.0)
    # ... and at reveal, for a body sealed without the client's models.
    body = canonical.dumps(
        {"kind": "dp_mean_test", "variables": ["age"], "group": "sex", "sigma": 5.0}
    )
    sealed = seal(
        [body],
        centre.keys["ada"],
        researcher="ada",
        project="p1",
        dataset="dpcensus",
        server=centre.server_id,
    )
    (result,) = _run(server, centre, sealed, "ada")
    assert result.failed and result.error_code == "invalid_analysis"
    assert "'sigma'" in (result.error_message or "") and "epsilon" in (result.error_message or "")
