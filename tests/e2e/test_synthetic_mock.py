"""The DP mock: generated and published by the controller's CLI, charged once to the dataset's
public ledger, listed in the catalogue, verified by the client, composed with every scope ledger.

Expected figures: the (1, 1e-5) budget as mu_b = 1 / 3.7306316348 (the analytic Gaussian
reference of test_dp.py), mu = 0.18197 at (1, 1e-9) (the design note), the mock's mu^2 = 0.04.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Dataset, centre_store, make_centre, serving, set_dp
from test_synthetic_data import CMC_COLUMNS, OPEN_GATES, cmc_frame, cmc_metadata

from safeaccess.client.analyses import SyntheticData, to_body
from safeaccess.client.mock import LABEL, MockInvalid
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.server.admin.cli import main as admin
from safeaccess.server.http.embedded import EmbeddedServer

pytest.importorskip("mbi")

BUDGET_MU2 = 1.0 / 3.7306316348**2  # (1, 1e-5)
MU_1_1E9 = 0.18197


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
    config = make_centre(root, "mock-centre", {"ada": key}, datasets)
    d = ["--data-dir", str(root)]
    for name in names:
        set_dp(root, name, "1", "1e-5")
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
