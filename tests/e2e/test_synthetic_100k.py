"""A DP MST release (epsilon 1) of a generated 100 000-record table passes the default disclosure
check through the real server, client and process sandbox (issue 23): the HTTP twin of the
rules-level calibration in `tests/server/test_synthetic_calibration_100k.py`.

Kept as cheap as the full path allows: four categorical columns (5, 4, 10 and 3 levels), three
declared quasi-identifiers and one sensitive target, so the attack check runs one target over
four key sets; the rest of the pipeline (exact tables in sandbox job 1, server-side noise and
tree, the synth worker's Private-PGM fit and sample, the whole check in sandbox job 2, the
ledger charge, the signed receipt) is the production one. The noise is numpy's Gaussian with a
fixed seed in place of OpenDP's (the same distribution; the test is about the release path) and
the worker samples with a seed, so the verdict is reproducible.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import centre_store, make_centre, seed_synthesis, serving, set_dp

from safeaccess.client.analyses import SyntheticData, to_body
from safeaccess.client.metadata import Column, DatasetMetadata
from safeaccess.client.protocol import seal
from safeaccess.client.session import connect
from safeaccess.rules.dp import gaussian_mu_for
from safeaccess.server.http.embedded import EmbeddedServer

pytest.importorskip("mbi")
pytestmark = pytest.mark.slow  # a Private-PGM fit and a whole check at 100 000 records

LEVELS = (5, 4, 10, 3)
NAMES = [f"c{i}" for i in range(len(LEVELS))]
TARGET = NAMES[-1]
N = 100_000


def chain_table(n: int, seed: int) -> pd.DataFrame:
    """Each column a copy of the previous one (modulo its levels) kept with probability 0.6,
    otherwise drawn uniformly: a Markov chain, which MST's tree can represent."""
    rng = np.random.default_rng(seed)
    cols = [rng.integers(0, LEVELS[0], n)]
    for lv in LEVELS[1:]:
        keep = rng.random(n) > 0.4
        cols.append(np.where(keep, cols[-1] % lv, rng.integers(0, lv, n)))
    return pd.DataFrame(dict(zip(NAMES, cols, strict=True)))


def chain_metadata(name: str) -> DatasetMetadata:
    return DatasetMetadata(
        name=name,
        columns=[
            Column(
                name=c,
                type="categorical",
                levels=list(range(lv)),
                nullable=False,
                quasi_identifier=c != TARGET,
                sensitive=c == TARGET,
            )
            for c, lv in zip(NAMES, LEVELS, strict=True)
        ],
    )


@pytest.fixture(scope="module")
def centre(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Ed25519PrivateKey]:
    root = tmp_path_factory.mktemp("synth100k") / "data"
    key = Ed25519PrivateKey.generate()
    datasets = {"chain": (chain_table(N, seed=7), chain_metadata("chain"))}
    config = make_centre(root, "synth-100k", {"ada": key}, datasets)
    set_dp(root, "chain", "2", "1e-9")
    return root, config.server_id, key


@pytest.fixture(scope="module")
def server(centre: tuple[Path, str, Ed25519PrivateKey]) -> Iterator[EmbeddedServer]:
    with serving(centre[0]) as (_, srv):
        yield srv


def test_dp_mst_release_of_100k_records_over_http(
    server: EmbeddedServer,
    centre: tuple[Path, str, Ed25519PrivateKey],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed_synthesis(monkeypatch, 1)
    root, server_id, key = centre
    analysis = SyntheticData(columns=NAMES, epsilon=1.0, delta=1e-9)
    sealed = seal(
        [to_body(analysis)], key, researcher="ada", project="p1", dataset="chain", server=server_id
    )
    with connect(server.url, key, "ada") as session:
        (result,) = session.run(sealed)
    with centre_store(root) as store:
        row = store.get_step(result.sequence_id, result.index)
    assert row is not None and row.output is not None
    check = row.output["facts"]["check"]
    assert result.status == "released", check["outcomes"]
    assert row.output["privacy"]["mu"] == pytest.approx(gaussian_mu_for(1.0, 1e-9), rel=1e-6)
    facts = check["checks"]
    assert facts["n_real"] == N
    # one target over the key sets of lengths 2 and 3 of the three quasi-identifiers
    # one target (the sensitive column) over the key sets of lengths 2 and 3 of the three keys
    assert [(a["target"], a["keys"]) for a in facts["attack"]] == [
        (3, [0, 1]),
        (3, [0, 2]),
        (3, [1, 2]),
        (3, [0, 1, 2]),
    ]
    assert max(a["excess"]["estimate"] for a in facts["attack"]) < 0.02
    assert facts["uniques"]["excess"]["estimate"] < 0.01
