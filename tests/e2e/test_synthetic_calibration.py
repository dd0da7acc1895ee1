"""DP MST releases pass the default disclosure check on CMC, through the real server, client and
process sandbox (issue 23): at epsilon 1 (delta 1e-9, mu 0.182) and at mu = 50 (epsilon 1 550),
with age in the declared 7 bins and in 1-year bins. The leaking synthesisers stay withheld
(`test_synthetic_checks.py`).

The noise and the sampler take fixed seeds so that the verdicts are reproducible: the server's
OpenDP Gaussian is replaced by numpy's with a seed (the same distribution; the test is about the
check, not the noise source) and the worker samples with a seed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import centre_store, make_centre, seed_synthesis, serving, set_dp
from test_synthetic_data import CMC_COLUMNS, cmc_frame, cmc_metadata

from safeaccess.client.analyses import SYNTH_MAX_EPSILON, SyntheticData, to_body
from safeaccess.client.metadata import DatasetMetadata
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.rules.dp import gaussian_mu_for
from safeaccess.server.config import DPConfig
from safeaccess.server.http.embedded import EmbeddedServer

pytest.importorskip("mbi")
pytestmark = pytest.mark.slow  # five Private-PGM fits through the server

# mu = 50 at delta 1e-9 takes epsilon ~1 550 (GDP: epsilon grows like mu^2 / 2)
EPSILON_MU50 = 1550.0


def _yearly(name: str) -> DatasetMetadata:
    """CMC with the wife's age in 1-year bins (33 codes) instead of 7."""
    meta = cmc_metadata(name)
    cols = [
        c.model_copy(update={"synth_bins": [float(a) for a in range(16, 50)]})
        if c.name == "wife_age"
        else c
        for c in meta.columns
    ]
    return meta.model_copy(update={"columns": cols})


@pytest.fixture(scope="module")
def centre(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Ed25519PrivateKey]:
    root = tmp_path_factory.mktemp("synthcal") / "data"
    key = Ed25519PrivateKey.generate()
    datasets = {
        "cmc": (cmc_frame(), cmc_metadata("cmc")),
        "cmcyear": (cmc_frame(), _yearly("cmcyear")),
    }
    config = make_centre(root, "synth-cal", {"ada": key}, datasets)
    for name in ("cmc", "cmcyear"):
        # a budget that covers mu = 50 once (the calibration's top; no real budget is this big)
        set_dp(root, name, "2000", "1e-9")
    return root, config.server_id, key


@pytest.fixture(scope="module")
def server(centre: tuple[Path, str, Ed25519PrivateKey]) -> Iterator[EmbeddedServer]:
    with serving(centre[0]) as (_, srv):
        yield srv


def test_mu_50_is_requestable_and_the_bound_still_catches_typos() -> None:
    assert gaussian_mu_for(EPSILON_MU50, 1e-9) == pytest.approx(50.0, abs=0.05)
    SyntheticData(columns=CMC_COLUMNS, epsilon=EPSILON_MU50, delta=1e-9)
    DPConfig(epsilon=SYNTH_MAX_EPSILON, delta=1e-9)
    with pytest.raises(ValueError, match="less than or equal to 2000"):
        SyntheticData(columns=CMC_COLUMNS, epsilon=1e9, delta=1e-9)
    with pytest.raises(ValueError, match="less than or equal to 2000"):
        DPConfig(epsilon=2001.0, delta=1e-9)


@pytest.mark.parametrize(
    ("dataset", "epsilon", "seed"),
    [
        ("cmc", 1.0, 1),
        ("cmc", 1.0, 2),
        ("cmc", EPSILON_MU50, 1),
        ("cmcyear", 1.0, 1),
        ("cmcyear", EPSILON_MU50, 1),
    ],
)
def test_dp_mst_releases_pass_the_default_check(
    server: EmbeddedServer,
    centre: tuple[Path, str, Ed25519PrivateKey],
    monkeypatch: pytest.MonkeyPatch,
    dataset: str,
    epsilon: float,
    seed: int,
) -> None:
    seed_synthesis(monkeypatch, seed)
    root, server_id, key = centre
    analysis = SyntheticData(columns=CMC_COLUMNS, epsilon=epsilon, delta=1e-9)
    sealed = seal(
        [to_body(analysis)], key, researcher="ada", project="p1", dataset=dataset, server=server_id
    )
    with connect(server.url, key, "ada") as session:
        (result,) = session.run(sealed)
    with centre_store(root) as store:
        row = store.get_step(result.sequence_id, result.index)
    assert row is not None and row.output is not None
    check = row.output["facts"]["check"]
    assert result.status == "released", check["outcomes"]
    assert row.output["privacy"]["mu"] == pytest.approx(gaussian_mu_for(epsilon, 1e-9), rel=1e-6)
    # the facts behind the verdict, for checkers: the attack stays at or below its reference,
    # and S reproduces no more real uniques than the other half of the real data does
    facts = check["checks"]
    assert facts["n_real"] == 1473
    assert max(a["excess"]["estimate"] for a in facts["attack"]) < 0.02
    assert facts["uniques"]["excess"]["estimate"] < 0.01
