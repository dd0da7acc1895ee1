"""The DP mock: generated and published by the controller's CLI, charged once to the dataset's
public ledger, listed in the catalogue, verified by the client, composed with every scope ledger.

Expected figures: the (1, 1e-5) budget as mu_b = 1 / 3.7306316348 (the analytic Gaussian
reference of test_dp.py), mu = 0.18197 at (1, 1e-9) (the design note), the mock's mu^2 = 0.04.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Dataset, centre_store, make_centre, serving, set_dp
from test_synthetic_data import CMC_COLUMNS, OPEN_GATES, cmc_frame, cmc_metadata

from safeaccess.client.analyses import SyntheticData, to_body
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.mock import LABEL, MockInvalid
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.client.validation import AnalysisInvalid
from safeaccess.server.admin.cli import main as admin
from safeaccess.server.http.embedded import EmbeddedServer

pytest.importorskip("mbi")

BUDGET_MU2 = 1.0 / 3.7306316348**2  # (1, 1e-5)
MU_1_1E9 = 0.18197


SPAN = ("2019-01-01", "2020-12-31")
DATED_COLUMNS = ["husband_education", "contraceptive_method"]


def dated_frame() -> pd.DataFrame:
    """Two CMC columns and a day of admission (text, as a CSV holds it): 80 % in 2019, 20 %
    in 2020, 3 % missing."""
    frame = cmc_frame()[DATED_COLUMNS]
    rng = np.random.default_rng(44)
    n = len(frame)
    days = np.where(rng.random(n) < 0.8, rng.integers(0, 365, n), rng.integers(365, 731, n))
    admitted = pd.Timestamp(SPAN[0]) + pd.to_timedelta(days, unit="D")
    text = pd.Series(admitted.strftime("%Y-%m-%d"), dtype=object)
    return frame.assign(admitted=text.mask(rng.random(n) < 0.03, None))


def dated_metadata(name: str, bounds: tuple[str, str] | None) -> DatasetMetadata:
    base = cmc_metadata(name)
    kept = [c for c in base.columns if c.name in DATED_COLUMNS]
    admitted = Column(name="admitted", type="date", date_bounds=bounds)  # type: ignore[arg-type]
    return base.model_copy(update={"columns": [*kept, admitted]})


@pytest.fixture(scope="module")
def centre(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Ed25519PrivateKey]:
    root = tmp_path_factory.mktemp("mockcentre") / "data"
    key = Ed25519PrivateKey.generate()
    rules = root.parent / "open.yaml"
    # the controller opened the synth_* gates on these datasets (the default rules' calibration
    # is exercised in test_synthetic_checks.py); the mock's path is what is tested here
    rules.write_text("name: open\n" + "".join(f"{k}: 1.0\n" for k in OPEN_GATES))
    names = ("cmcmock", "cmcnomock")
    opened = {"rules_file": rules}
    datasets = {name: Dataset(cmc_frame(), cmc_metadata(name), options=opened) for name in names}
    for name, bounds in (("cmcdated", SPAN), ("cmcundated", None)):
        datasets[name] = Dataset(dated_frame(), dated_metadata(name, bounds), options=opened)
    config = make_centre(root, "mock-centre", {"ada": key}, datasets)
    d = ["--data-dir", str(root)]
    for name in names:
        set_dp(root, name, "1", "1e-5")
    for name in ("cmcdated", "cmcundated"):  # room for a mock at mu 1 and a step beside it
        set_dp(root, name, "8", "1e-5")
    assert (
        admin(["dataset", "mock", "cmcmock", "--mu", "0.2", "--rows", "500", "--publish", *d]) == 0
    )
    return root, config.server_id, key


@pytest.fixture(scope="module")
def server(centre: tuple[Path, str, Ed25519PrivateKey]) -> Iterator[EmbeddedServer]:
    with serving(centre[0]) as (_, srv):
        yield srv


def _spent(root: Path, key: str) -> tuple[float, int]:
    with centre_store(root) as store:
        state = store.dp_ledger(key)
        return state.spent, state.releases


def test_the_mock_is_charged_once_to_the_public_ledger_and_listed(
    server: EmbeddedServer, centre: tuple[Path, str, Ed25519PrivateKey]
) -> None:
    root, _, key = centre
    spent, releases = _spent(root, "cmcmock|public|public")
    assert releases == 1 and spent == pytest.approx(0.04, rel=1e-9)
    assert _spent(root, "cmcnomock|public|public") == (0.0, 0)
    with connect(server.url, key, "ada") as session:
        entries = {d["name"]: d for d in session.datasets()}
    listed = entries["cmcmock"]["mock"]["manifest"]
    assert listed["rows"] == 500 and listed["mu"] == pytest.approx(0.2, rel=1e-12)
    assert listed["dataset"] == "cmcmock" and len(listed["tree"]) == len(CMC_COLUMNS) - 1
    assert entries["cmcnomock"]["mock"] is None


def test_the_client_verifies_the_signed_mock(
    server: EmbeddedServer, centre: tuple[Path, str, Ed25519PrivateKey]
) -> None:
    root, _, key = centre
    with connect(server.url, key, "ada") as session:
        frame = session.mock("cmcmock")
    assert list(frame.columns) == CMC_COLUMNS and len(frame) == 500
    assert frame.attrs["safeaccess_mock"]["label"] == LABEL
    assert frame["wife_age"].between(16, 49).all()
    # a manifest changed on disk no longer carries the centre's signature
    manifest_file = root / "datasets" / "cmcmock" / "v1.mock.json"
    original = manifest_file.read_text()
    signed = json.loads(original)
    signed["manifest"]["mu"] = 0.01
    manifest_file.write_text(json.dumps(signed))
    try:
        with connect(server.url, key, "ada") as session, pytest.raises(MockInvalid):
            session.mock("cmcmock")
    finally:
        manifest_file.write_text(original)


def test_a_scope_ledger_composes_with_the_public_ledger(
    server: EmbeddedServer, centre: tuple[Path, str, Ed25519PrivateKey]
) -> None:
    _, server_id, key = centre
    # mu^2 of (1, 1e-9) fits the (1, 1e-5) budget alone, not with the mock's 0.04 beside it
    assert MU_1_1E9**2 < BUDGET_MU2 < MU_1_1E9**2 + 0.04
    analysis = SyntheticData(columns=["wife_age", "husband_education"], epsilon=1.0, delta=1e-9)
    results = {}
    for dataset in ("cmcmock", "cmcnomock"):
        sealed = seal(
            [to_body(analysis)],
            key,
            researcher="ada",
            project="p1",
            dataset=dataset,
            server=server_id,
        )
        with connect(server.url, key, "ada") as session:
            (results[dataset],) = session.run(sealed)
    refused = results["cmcmock"]
    assert refused.status == "withheld" and [r.check for r in refused.reasons] == ["dp_budget"]
    assert "published mock" in refused.reasons[0].message
    assert [r.check for r in results["cmcnomock"].reasons] != ["dp_budget"]
    assert _spent(centre[0], "cmcnomock|researcher|ada")[1] == 1
    assert _spent(centre[0], "cmcmock|researcher|ada") == (0.0, 0)


def test_a_plan_rehearses_locally_on_the_mock(
    server: EmbeddedServer, centre: tuple[Path, str, Ed25519PrivateKey]
) -> None:
    _, _, key = centre
    with connect(server.url, key, "ada") as session:
        mock = session.mock("cmcmock")
        plan = session.plan("cmcmock")
    plan.frequency_table("husband_education", "wife_education")
    plan.dp_count(by="contraceptive_method", epsilon=1.0, delta=1e-6)
    plan.synthetic_data(["wife_age", "children"], epsilon=1.0, delta=1e-9)
    report = plan.rehearse(mock, show=False)
    text = str(report)
    assert text.startswith("REHEARSAL ON A DP MOCK") and "predict nothing" in text
    outcomes = [(s.kind, s.outcome.split(":")[0]) for s in report.steps]
    assert outcomes == [
        ("frequency_table", "rules on the mock"),
        ("dp_count", "computed"),
        ("synthetic_data", "computed"),
    ]


def test_offline_rehearsal_runs_on_the_published_mock_the_plan_fetched(
    server: EmbeddedServer, centre: tuple[Path, str, Ed25519PrivateKey]
) -> None:
    _, _, key = centre
    with connect(server.url, key, "ada") as session:
        plan = session.plan("cmcmock").frequency_table("husband_education", "wife_education")
        plain = session.plan("cmcnomock").frequency_table("husband_education", "wife_education")
        mock = session.mock("cmcmock")
    # The session is closed: both rehearse here, on what plan() cached.
    report = plan.rehearse(show=False)
    assert report.offline and report.mock_source == "published DP mock"
    assert report.mock_rows == len(mock) == 500 and report.rows == len(cmc_frame())
    assert report.steps[0].mock_verdict in ("release", "withhold", "review")
    other = plain.rehearse(show=False)
    assert other.offline and other.mock_source.startswith("mock from the published metadata")
    assert other.mock_rows == len(cmc_frame())


def test_a_mock_the_budget_cannot_cover_is_refused_by_the_cli_and_charges_nothing(
    centre: tuple[Path, str, Ed25519PrivateKey], capsys: pytest.CaptureFixture[str]
) -> None:
    root = centre[0]
    d = ["--data-dir", str(root)]
    before = _spent(root, "cmcnomock|public|public")
    # mu = 0.5: mu^2 = 0.25 > the (1, 1e-5) budget's 0.0719
    assert admin(["dataset", "mock", "cmcnomock", "--mu", "0.5", "--publish", *d]) != 0
    assert "does not fit" in capsys.readouterr().err
    assert _spent(root, "cmcnomock|public|public") == before
    assert not (root / "datasets" / "cmcnomock" / "v1.mock.json").exists()
    assert admin(["dataset", "budget", "cmcmock", *d]) == 0
    assert "public public: 1 releases" in capsys.readouterr().out


def test_a_dataset_with_a_date_column_publishes_a_mock_holding_dates_that_rehearses_offline(
    server: EmbeddedServer,
    centre: tuple[Path, str, Ed25519PrivateKey],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The mock synthesises the date column in calendar months of its date_bounds: its records
    hold dates inside the bounds, about as many in 2019 as the real data, and an offline
    rehearsal on it groups them by year(admitted) as the centre's rehearsal does."""
    root, _, key = centre
    d = ["--data-dir", str(root)]
    assert (
        admin(["dataset", "mock", "cmcdated", "--mu", "1", "--rows", "500", "--publish", *d]) == 0
    )
    assert "published in the catalogue" in capsys.readouterr().out
    real = pd.to_datetime(dated_frame()["admitted"])
    with connect(server.url, key, "ada") as session:
        mock = session.mock("cmcdated")
        plan = session.plan("cmcdated").frequency_table("year(admitted)", "contraceptive_method")
        online = plan.rehearse(show=False)
    assert list(mock.columns) == [*DATED_COLUMNS, "admitted"] and len(mock) == 500
    dates = mock["admitted"]
    kept = dates.dropna()
    assert pd.api.types.is_datetime64_any_dtype(dates) and (kept == kept.dt.normalize()).all()
    assert kept.between(*(pd.Timestamp(b) for b in SPAN)).all()
    assert dates.dt.month.nunique() == 12 and dates.dt.day.nunique() == 31  # days, not bins
    # mu 1: the one-way noise sd is about 4.5 records a month, so 2019's share is near 0.8
    share = (dates.dt.year == 2019).sum() / dates.notna().sum()
    assert abs(share - (real.dt.year == 2019).sum() / real.notna().sum()) < 0.1
    assert 0 < dates.isna().sum() < 100  # the null code: the 3 % missing
    # The session is closed: the plan rehearses here, on the published mock it fetched.
    offline = plan.rehearse(show=False)
    assert offline.offline and offline.mock_source == "published DP mock"
    assert [s.mock_verdict for s in offline.steps] == [s.mock_verdict for s in online.steps]
    assert [s.mock_verdict for s in offline.steps] == ["release"]
    # a two-way table: the note says what the DP mock cannot tell (its noisy small cells)
    assert "DP mock's cells of year(admitted)" in (offline.steps[0].note or "")
    # the table it checked: the declared years by the levels, pandas' counts of the mock
    from safeaccess.client.analyses import FrequencyTable
    from safeaccess.sandbox.runner import execute

    table = execute(
        FrequencyTable(rows=["year(admitted)"], cols=["contraceptive_method"]),
        mock,
        dated_metadata("cmcdated", SPAN),
    ).model_dump(mode="json")
    assert [r for (r,) in table["row_labels"]] == [2019, 2020]
    expected = pd.crosstab(dates.dt.year, mock["contraceptive_method"])
    assert table["values"] == expected.to_numpy().tolist()


def test_a_researcher_gets_synthetic_dates_and_an_unbounded_date_is_refused_in_one_line(
    server: EmbeddedServer,
    centre: tuple[Path, str, Ed25519PrivateKey],
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, _, key = centre
    with connect(server.url, key, "ada") as session:
        plan = session.plan("cmcdated").synthetic_data(
            ["admitted", "contraceptive_method"], epsilon=3.0, delta=1e-9, rows=500
        )
        (result,) = session.run(session.seal(plan))
        assert result.status == "released", result.reasons
        assert result.output is not None
        (view, _) = result.output["columns"]
        assert view["type"] == "date" and view["levels"] is None
        assert view["date_bins"][:2] == ["2019-01-01", "2019-02-01"]
        assert view["date_bins"][-2:] == ["2020-12-01", "2020-12-31"]
        records = result.frame()
        years = records["admitted"].dt.year.value_counts(normalize=True)
        assert records["admitted"].dropna().between(*(pd.Timestamp(b) for b in SPAN)).all()
        real = pd.to_datetime(dated_frame()["admitted"]).dt.year.value_counts(normalize=True)
        assert abs(years[2019] - real[2019]) < 0.1  # mu 0.51: noise sd about 0.02
        with pytest.raises(AnalysisInvalid) as refused:
            session.plan("cmcundated").synthetic_data(
                ["admitted", "husband_education"], epsilon=1.0, delta=1e-9
            )
        assert "'admitted' is a date without declared date_bounds" in str(refused.value)
    d = ["--data-dir", str(root)]
    assert admin(["dataset", "mock", "cmcundated", "--publish", *d]) != 0
    err = capsys.readouterr().err.strip()
    assert "without declared date_bounds" in err and err.count("\n") == 0
    assert _spent(root, "cmcundated|public|public") == (0.0, 0)
