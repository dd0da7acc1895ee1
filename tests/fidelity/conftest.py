"""The reference suite's fixture: one centre and one real server for the whole module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fidelity_data import RESEARCHERS, Fidelity, make_frame, metadata

from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.server.admin.cli import main as admin
from safeaccess.server.config import DataDir, QssSettings, initialise
from safeaccess.server.datasets import register_dataset
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.store import Store


@pytest.fixture(scope="module")
def fidelity(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fidelity]:
    root = tmp_path_factory.mktemp("fidelity") / "data"
    config = initialise(root, server_id="fidelity-centre")
    data = DataDir(root)
    keys = {name: Ed25519PrivateKey.generate() for name in RESEARCHERS}
    frame = make_frame()
    store = Store(data.database_url(config))
    try:
        store.add_project("p1")
        for name, key in keys.items():
            pub = key.public_key()
            store.add_researcher(name, public_key_text(pub), fingerprint(pub), ["p1"])
        for name in ("dpsurvey", "survey"):
            register_dataset(
                data,
                store,
                name=name,
                frame=frame,
                metadata=metadata(name),
                project="p1",
                # Audited per researcher: each test (its own researcher) is compared with its
                # reference alone; a mean of the present incomes per region after the region
                # counts would rightly isolate a small region's few missing incomes.
                qss=QssSettings(scope="researcher"),
            )
    finally:
        store.close()
    # A budget large enough for every DP release of the suite (each asks its own epsilon).
    assert (
        admin(
            [
                "dataset",
                "dp",
                "dpsurvey",
                "--epsilon",
                "400",
                "--delta",
                "1e-5",
                "--data-dir",
                str(root),
            ]
        )
        == 0
    )
    service = Service(root)
    with service, EmbeddedServer(create_app(service)) as srv:
        yield Fidelity(
            root=root,
            server_id=config.server_id,
            keys=keys,
            frame=frame,
            url=srv.url,
            free=list(RESEARCHERS),
        )
