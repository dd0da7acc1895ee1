"""A real PostgreSQL for store tests: $SAFEACCESS_TEST_POSTGRES_URL, else a throwaway cluster
started with the local initdb/pg_ctl (as the `postgres` user when the tests run as root);
`postgres_database` is a new empty database in it for one test."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import NoReturn

import pytest
from sqlalchemy import create_engine, make_url, text

ENV_URL = "SAFEACCESS_TEST_POSTGRES_URL"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_url(missing_postgres: Callable[[str], NoReturn]) -> Iterator[str]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing_postgres("the PostgreSQL driver psycopg (dev extra) is not installed")
    if os.environ.get(ENV_URL):
        yield os.environ[ENV_URL]
        return
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb is None or pg_ctl is None:
        missing_postgres(f"no PostgreSQL: set {ENV_URL} or install initdb/pg_ctl")
    prefix: list[str] = []
    folder = tempfile.mkdtemp(prefix="safeaccess-pg-")
    if os.geteuid() == 0:  # initdb refuses to run as root
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    data = os.path.join(folder, "data")
    port = _free_port()

    def quiet(*command: str) -> None:
        subprocess.run(
            [*prefix, *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
        )

    quiet(initdb, "-D", data, "-A", "trust", "-U", "sa", "--no-sync")
    quiet(pg_ctl, "-D", data, "-w", "-o", f"-k {folder} -p {port} -c listen_addresses=''", "start")
    try:
        yield f"postgresql+psycopg://sa@/postgres?host={folder}&port={port}"
    finally:
        subprocess.run(
            [*prefix, pg_ctl, "-D", data, "-m", "immediate", "stop"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_database(postgres_url: str) -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database, dropped after the test."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(postgres_url).set(database=name).render_as_string(False)
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
