"""Starting the deployment of docs/deploy.md on loopback (see conftest.py): PostgreSQL, the
centre, the workers (execution = "queue"), two replicas and HAProxy."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import NoReturn

import pytest
from cluster_centre import AUDITOR, RESEARCHERS, Balanced, build_centre, use_queue
from cluster_support import HAProxy
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import create_engine, make_url, text

from pg_throwaway import ThrowawayPostgres, available, free_port
from tls_certs import make_tls

# Health checks every 200 ms: a dead replica is out after 3 misses (or at once on a refused
# connection: `observe layer4`), so the tests do not wait for production's 2 s interval.
CHECK_INTER = "200ms"


def start_cluster(
    tmp_path_factory: pytest.TempPathFactory,
    missing_postgres: Callable[[str], NoReturn],
    execution: str,
    *,
    pools: dict[str, str] | None = None,
) -> Iterator[Balanced]:
    """Start PostgreSQL, the centre, (with "queue") two process-backend workers, two replicas
    and HAProxy; yield the cluster; stop everything."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing_postgres("the PostgreSQL driver psycopg (dev extra) is not installed")
    if not available():
        missing_postgres("no initdb/pg_ctl: the cluster tests start their own PostgreSQL")
    if shutil.which("haproxy") is None:  # required wherever PostgreSQL is (CI)
        missing_postgres("no haproxy (Debian's haproxy package; .ci/run installs it)")
    folder = tmp_path_factory.mktemp("cluster")
    postgres = ThrowawayPostgres()
    postgres.start()
    haproxy: HAProxy | None = None
    cluster: Balanced | None = None
    try:
        admin = create_engine(postgres.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text('CREATE DATABASE "safeaccess"'))
        admin.dispose()
        url = make_url(postgres.url).set(database="safeaccess").render_as_string(False)
        keys = {name: Ed25519PrivateKey.generate() for name in [*RESEARCHERS, AUDITOR]}
        root = folder / "data"
        config = build_centre(root, "cluster", url, keys)
        if execution == "queue":
            use_queue(root, pools or {})
        ports = [free_port(), free_port()]
        logs = [folder / f"replica{i}.log" for i in range(2)]
        ca_file, pem = make_tls(folder)
        haproxy = HAProxy(
            folder,
            free_port(),
            pem,
            [f"127.0.0.1:{p}" for p in ports],
            CHECK_INTER,
        )
        cluster = Balanced(
            root=root,
            folder=folder,
            postgres=postgres,
            url=url,
            server_id=config.server_id,
            keys=keys,
            ca_file=ca_file,
            haproxy=haproxy,
            ports=ports,
            logs=logs,
            replicas=[None, None],
            execution=execution,
        )
        if execution == "queue":
            for i in range(2):
                cluster.start_worker(i)
        for i in range(2):
            cluster.start_replica(i)
        haproxy.start(ca_file)
        haproxy.wait_for("api1", "UP")
        haproxy.wait_for("api2", "UP")
        yield cluster
    finally:
        if haproxy is not None:
            haproxy.stop()
        for proc in [*cluster.replicas, *cluster.workers] if cluster is not None else []:
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        postgres.remove()
