"""The schema's version and its migrations (Alembic), for the store and `safeaccess-server db`.

A new database is created from the models and stamped with the newest revision. A database of
an older schema is never changed behind the operator's back: opening it raises `SchemaBehind`,
which says to run `safeaccess-server db upgrade` (with several API replicas, one upgrade, then
every replica restarted, rather than each replica migrating as it starts). A database made
before migrations existed (no `alembic_version` table, but the tables) is at `BASELINE`, the
schema those releases created.

Every schema change is a new module in `migrations/versions/`; `tests/server/test_migrations.py`
checks that upgrading a fixture of the previous release gives exactly the models' schema.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect

from safeaccess.server.store import affinity, queue
from safeaccess.server.store.schema import Base

MIGRATIONS = Path(__file__).with_name("migrations")
#: The revision of a database created before migrations existed.
BASELINE = "0001"


class SchemaBehind(RuntimeError):
    """The database's schema is older than this server's: it must be upgraded first."""


def _config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head() -> str:
    """The newest revision this server knows."""
    revision = ScriptDirectory.from_config(_config()).get_current_head()
    assert revision is not None, "the migrations directory has no revision"
    return revision


def _has_tables(connection: Connection) -> bool:
    names = set(inspect(connection).get_table_names())
    return bool(names & set(Base.metadata.tables))


def current(engine: Engine) -> str | None:
    """The database's revision: None for an empty database, `BASELINE` for one made before
    migrations existed."""
    with engine.connect() as connection:
        revision = MigrationContext.configure(connection).get_current_revision()
        if revision is None and _has_tables(connection):
            return BASELINE
        return revision


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Bring the database to the newest revision; returns (before, after). An empty database
    is created at the newest revision."""
    before = current(engine)
    with engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            # SQLite changes a column by copying its table (Alembic's batch mode), which must
            # not run into the foreign keys of the tables referring to it: they are off during
            # the migration and checked before it commits (SQLite's own ALTER TABLE procedure).
            # The pragma is a no-op inside a transaction, so it goes first.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        try:
            with connection.begin():
                config = _config(connection)
                if before is None:
                    Base.metadata.create_all(connection)
                    queue.install_schema(connection)  # what migration 0004 adds, on PostgreSQL
                    affinity.install_claim(connection)  # and 0005
                    command.stamp(config, "head")
                else:
                    if MigrationContext.configure(connection).get_current_revision() is None:
                        command.stamp(config, BASELINE)
                    command.upgrade(config, "head")
                if sqlite:
                    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if broken:
                        raise RuntimeError(f"the migration broke foreign keys: {broken[:5]}")
        finally:
            if sqlite:
                connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                connection.commit()
    return before, head()


def ensure(engine: Engine) -> None:
    """Open a database for the store: create a new one at the newest revision; refuse one at an
    older revision with `SchemaBehind` (and one at a newer revision too: this server's code
    would not know its tables)."""
    revision = current(engine)
    if revision is None:
        upgrade(engine)
        return
    newest = head()
    if revision == newest:
        return
    known = {s.revision for s in ScriptDirectory.from_config(_config()).walk_revisions()}
    if revision not in known:
        raise SchemaBehind(
            f"the database schema is at revision {revision}, which this server does not know "
            f"(it knows up to {newest}): run a server of the release that upgraded it"
        )
    raise SchemaBehind(
        f"the database schema is at revision {revision}; this server needs {newest}: back the "
        "database up, then run `safeaccess-server db upgrade` (once, with every server stopped)"
    )
