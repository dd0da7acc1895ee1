"""A real centre for end-to-end tests: data directory, census dataset, researchers, and the API
served by uvicorn on a loopback port with the real (process) sandbox."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import ROWS, SEED, Centre, unguard

from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.server.config import DataDir, initialise
from safeaccess.server.datasets import register_dataset
from safeaccess.server.demo.data import census_metadata, generate_census
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store import Store


@pytest.fixture(scope="module")
def centre(tmp_path_factory: pytest.TempPathFactory) -> Centre:
    root = tmp_path_factory.mktemp("centre") / "data"
    config = initialise(root, server_id="test-centre")
    data = DataDir(root)
    ca_key = Ed25519PrivateKey.generate()
    (root / "ethics-board.pub").write_text(public_key_text(ca_key.public_key()))
    config = config.model_copy(update={"trusted_cas": {"ethics-board": "ethics-board.pub"}})
    data.save_config(config)
    keys = {name: Ed25519PrivateKey.generate() for name in ("ada", "bob", "carol")}
    census = generate_census(ROWS, seed=SEED)
    store = Store(data.database_url(config))
    try:
        store.add_project("p1")
        store.add_project("p2")
        for name, projects in (("ada", ["p1"]), ("bob", ["p1"]), ("carol", ["p2"])):
            pub = keys[name].public_key()
            store.add_researcher(name, public_key_text(pub), fingerprint(pub), projects)
        register_dataset(
            data,
            store,
            name="census",
            frame=census,
            metadata=census_metadata("census"),
            project="p1",
        )
        register_dataset(
            data,
            store,
            name="census2",
            frame=census.head(1000),
            metadata=census_metadata("census2"),
            project="p2",
        )
    finally:
        store.close()
    return Centre(root=root, server_id=config.server_id, keys=keys, census=census, ca_key=ca_key)


@pytest.fixture(scope="module")
def server(centre: Centre) -> Iterator[tuple[Service, EmbeddedServer]]:
    service = Service(centre.root)
    with service, EmbeddedServer(create_app(service)) as srv:
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
