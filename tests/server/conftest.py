"""A real PostgreSQL for store tests: $SAFEACCESS_TEST_POSTGRES_URL, else a throwaway cluster
started with the local initdb/pg_ctl (`pg_throwaway`); `postgres_database` is a new empty
database in it for one test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import NoReturn

import pytest
from sqlalchemy import create_engine, make_url, text

from pg_throwaway import ThrowawayPostgres, available

ENV_URL = "SAFEACCESS_TEST_POSTGRES_URL"


@pytest.fixture(scope="session")
def postgres_url(missing_postgres: Callable[[str], NoReturn]) -> Iterator[str]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing_postgres("the PostgreSQL driver psycopg (dev extra) is not installed")
    if os.environ.get(ENV_URL):
        yield os.environ[ENV_URL]
        return
    if not available():
        missing_postgres(f"no PostgreSQL: set {ENV_URL} or install initdb/pg_ctl")
    cluster = ThrowawayPostgres()
    cluster.start()
    try:
        yield cluster.url
    finally:
        cluster.remove()


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
