"""A real centre for end-to-end tests: data directory, census dataset, researchers, and the API
served by uvicorn on a loopback port with the real (process) sandbox."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import ROWS, SEED, Centre, Dataset, make_centre, serving, unguard

from safeaccess.client.keys import public_key_text
from safeaccess.server.config import DataDir
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service


@pytest.fixture(scope="module")
def centre(tmp_path_factory: pytest.TempPathFactory) -> Centre:
    root = tmp_path_factory.mktemp("centre") / "data"
    keys = {name: Ed25519PrivateKey.generate() for name in ("ada", "bob", "carol")}
    census = generate_census(ROWS, seed=SEED)
    config = make_centre(
        root,
        "test-centre",
        keys,
        {
            "census": (census, census_metadata("census")),
            "census2": Dataset(census.head(1000), census_metadata("census2"), "p2"),
        },
        projects={"carol": ["p2"]},
    )
    ca_key = Ed25519PrivateKey.generate()
    (root / "ethics-board.pub").write_text(public_key_text(ca_key.public_key()))
    config = config.model_copy(update={"trusted_cas": {"ethics-board": "ethics-board.pub"}})
    DataDir(root).save_config(config)
    return Centre(root=root, server_id=config.server_id, keys=keys, census=census, ca_key=ca_key)


@pytest.fixture(scope="module")
def server(centre: Centre) -> Iterator[tuple[Service, EmbeddedServer]]:
    with serving(centre.root) as (service, srv):
        yield service, srv


@pytest.fixture(params=["unguarded", "guarded"])
def guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each attack twice: with admission disabled (it must extract the value) and as deployed."""
    if request.param == "unguarded":
        unguard(monkeypatch)
    return str(request.param)


@pytest.fixture(scope="module")
def centre_server(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> tuple[Centre, EmbeddedServer]:
    """The module's centre and its real server (the attack suites register their own datasets
    in it and run every attack through HTTP)."""
    return centre, server[1]
