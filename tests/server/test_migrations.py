"""Schema migrations (Alembic): a database of the previous release upgrades with every row intact,
on SQLite and on PostgreSQL; the migrations build exactly the models; an older schema is refused
with what to do, not silently changed."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, MetaData, create_engine, inspect, make_url, select, text

from safeaccess.server.admin.cli import main
from safeaccess.server.config import DataDir, initialise
from safeaccess.server.store import Store, catalogue, make_engine, migrate
from safeaccess.server.store.queue import include_name
from safeaccess.server.store.schema import Base

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "release-46b8f63"


def _rows(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table but Alembic's, in primary-key order, by column name."""
    meta = MetaData()
    meta.reflect(engine)
    out: dict[str, list[dict[str, Any]]] = {}
    with engine.connect() as connection:
        for name, table in sorted(meta.tables.items()):
            if name == "alembic_version":
                continue
            order = list(table.primary_key.columns) or list(table.columns)
            query = select(table).order_by(*order)
            out[name] = [dict(r._mapping) for r in connection.execute(query)]
    return out


def _no_drift(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        # procrastinate's tables (the job queue, migration 0004) are not the models'
        context = MigrationContext.configure(connection, opts={"include_name": include_name})
        return list(compare_metadata(context, Base.metadata))


@pytest.fixture
def release_sqlite(tmp_path: Path) -> Iterator[Engine]:
    path = tmp_path / "safeaccess.db"
    shutil.copyfile(FIXTURE / "safeaccess.sqlite", path)
    engine = make_engine(f"sqlite:///{path}")
    yield engine
    engine.dispose()


@pytest.fixture
def release_postgresql(postgres_url: str) -> Iterator[Engine]:
    """A fresh PostgreSQL database with the previous release's schema and the fixture's rows."""
    name = f"release_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    engine = make_engine(make_url(postgres_url).set(database=name).render_as_string(False))
    source = make_engine(f"sqlite:///{FIXTURE / 'safeaccess.sqlite'}")
    try:
        lines = (FIXTURE / "schema.postgresql.sql").read_text().splitlines()
        ddl = "\n".join(line for line in lines if not line.startswith("--"))
        with engine.begin() as connection:
            for statement in ddl.split(";"):
                if statement.strip():
                    connection.exec_driver_sql(statement)
        old, new = MetaData(), MetaData()
        old.reflect(source)
        new.reflect(engine)
        with source.connect() as reading, engine.begin() as writing:
            for table in old.sorted_tables:
                rows = [dict(r._mapping) for r in reading.execute(select(table))]
                if rows:
                    writing.execute(new.tables[table.name].insert(), rows)
        yield engine
    finally:
        source.dispose()
        engine.dispose()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_the_previous_release_upgrades_with_every_row_intact(
    request: pytest.FixtureRequest, database: str
) -> None:
    engine: Engine = request.getfixturevalue(f"release_{database}")
    before = _rows(engine)
    assert len(before["events"]) == 45 and len(before["steps"]) == 7  # the fixture's content
    assert migrate.current(engine) == migrate.BASELINE  # made before migrations: no version
    assert "alembic_version" not in inspect(engine).get_table_names()
    was, now = migrate.upgrade(engine)
    assert (was, now) == (migrate.BASELINE, migrate.head())
    assert migrate.current(engine) == migrate.head()
    after = _rows(engine)
    # The Merkle nodes moved into the entries that complete them (migration 0008): each node
    # is in its last leaf's entry, at its level, and nothing else is there.
    nodes = before.pop("audit_nodes")
    assert "audit_nodes" not in after and len(nodes) > len(before["events"])
    merkle = {row["log_index"]: row["merkle"] for row in after["events"]}
    for node in nodes:
        level, keeper = node["level"], ((node["idx"] + 1) << node["level"]) - 1
        assert merkle[keeper][32 * level : 32 * level + 32] == node["hash"], node
    assert sum(len(m) for m in merkle.values()) == 32 * len(nodes)
    # every other row, with every value it had; later migrations may only add columns beside
    # them
    kept = {
        t: [{c: row[c] for c in old} for row, old in zip(after[t], rows, strict=True)]
        for t, rows in before.items()
    }
    assert kept == before
    assert _no_drift(engine) == []
    # and back: the downgrade rebuilds the node table from the entries, row for row
    with engine.begin() as connection:
        command.downgrade(migrate._config(connection), "0007")
    assert _rows(engine)["audit_nodes"] == nodes
    with engine.begin() as connection:
        command.upgrade(migrate._config(connection), "head")
    assert _rows(engine)["events"] == after["events"]
    # the job queue (migration 0004) lives on PostgreSQL only
    queue_tables = {t for t in inspect(engine).get_table_names() if t.startswith("procrastinate_")}
    assert bool(queue_tables) == (database == "postgresql"), queue_tables
    # the server opens it and reads what the old release wrote
    store = Store(engine.url.render_as_string(False))
    try:
        assert [d.version for d in catalogue.dataset_versions(store, "census")] == [1]
    finally:
        store.close()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_the_migrations_build_exactly_the_models(
    tmp_path: Path, request: pytest.FixtureRequest, database: str
) -> None:
    # every schema change must come with a migration: run the chain from nothing, not
    # create_all, and compare with the models
    if database == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'chain.db'}")
    else:
        url: str = request.getfixturevalue("postgres_url")
        name = f"chain_{uuid.uuid4().hex[:12]}"
        admin = create_engine(url, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        engine = make_engine(make_url(url).set(database=name).render_as_string(False))
    try:
        with engine.begin() as connection:
            command.upgrade(migrate._config(connection), "head")
        assert migrate.current(engine) == migrate.head()
        assert _no_drift(engine) == []
        # the job queue's migration goes back and forth: down leaves nothing of procrastinate
        with engine.begin() as connection:
            command.downgrade(migrate._config(connection), "0003")
        assert migrate.current(engine) == "0003"
        assert _queue_objects(engine) == []
        with engine.begin() as connection:
            command.upgrade(migrate._config(connection), "head")
        assert bool(_queue_objects(engine)) == (database == "postgresql")
        assert _no_drift(engine) == []
    finally:
        engine.dispose()


def _queue_objects(engine: Engine) -> list[str]:
    """procrastinate's tables, functions and types in the database (none on SQLite)."""
    if engine.dialect.name != "postgresql":
        return []
    with engine.connect() as connection:
        return list(
            connection.execute(
                text(
                    "SELECT relname FROM pg_class WHERE relname LIKE 'procrastinate%' "
                    "UNION ALL SELECT proname FROM pg_proc WHERE proname LIKE 'procrastinate%' "
                    "UNION ALL SELECT typname FROM pg_type WHERE typname LIKE 'procrastinate%'"
                )
            ).scalars()
        )


def test_a_new_database_starts_at_the_newest_revision(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        assert migrate.current(store.engine) == migrate.head()
        with store.engine.connect() as connection:
            stamped = MigrationContext.configure(connection).get_current_revision()
        assert stamped == migrate.head()
    finally:
        store.close()


def test_an_older_schema_is_refused_with_what_to_do(
    release_sqlite: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a server one revision ahead of the database: it refuses to open it and changes nothing
    url = release_sqlite.url.render_as_string(False)
    before = _rows(release_sqlite)
    monkeypatch.setattr(migrate, "head", lambda: "0002")
    with pytest.raises(migrate.SchemaBehind, match="safeaccess-server db upgrade"):
        Store(url)
    assert _rows(release_sqlite) == before
    assert "alembic_version" not in inspect(release_sqlite).get_table_names()


def test_an_unknown_revision_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'future.db'}"
    Store(url).close()
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(migrate.SchemaBehind, match="does not know"):
        Store(url)


def test_the_db_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "centre"
    initialise(root, server_id="migrating")
    data = DataDir(root)
    database = make_url(data.database_url(data.load_config())).database
    assert database is not None
    shutil.copyfile(FIXTURE / "safeaccess.sqlite", database)  # the old release's database
    assert main(["db", "current", "--data-dir", str(root)]) == 0
    assert f"schema revision: {migrate.BASELINE}" in capsys.readouterr().out
    assert main(["db", "upgrade", "--data-dir", str(root)]) == 0
    assert main(["db", "current", "--data-dir", str(root)]) == 0
    assert "(up to date)" in capsys.readouterr().out
