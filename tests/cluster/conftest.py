"""The deployment of docs/deploy.md on loopback, once per module: a PostgreSQL cluster of the
test's own (the tests restart it), a shared data directory, two `safeaccess-server serve`
replicas with the process sandbox, and HAProxy with deploy/haproxy/10-safeaccess.cfg in front,
terminating TLS with a certificate from a CA made by the test. Researchers and auditors use the
real client over HTTPS to HAProxy, trusting that CA (`ca_bundle=`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NoReturn

import pytest
from cluster_centre import Balanced
from cluster_start import start_cluster

# Health checks every 200 ms: a dead replica is out after 3 misses (or at once on a refused
# connection: `observe layer4`), so the tests do not wait for production's 2 s interval.
CHECK_INTER = "200ms"


@pytest.fixture(scope="module", params=["local", "queue"])
def balanced(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    missing_postgres: Callable[[str], NoReturn],
) -> Iterator[Balanced]:
    """The cluster of docs/deploy.md, with each execution: the replicas run the steps
    themselves ("local"), or two worker hosts run them from the job queue ("queue")."""
    yield from start_cluster(tmp_path_factory, missing_postgres, request.param)
