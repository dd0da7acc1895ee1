"""`safeaccess-server db current | upgrade`: the database schema's revision and its migrations."""

from __future__ import annotations

import argparse
from typing import Any

from sqlalchemy import Engine

from safeaccess.server.config import DataDir, default_data_dir
from safeaccess.server.store import make_engine, migrate

EXIT_OK = 0


def _engine(args: argparse.Namespace) -> Engine:
    data = DataDir(args.data_dir or default_data_dir())
    return make_engine(data.database_url(data.load_config()))


def _current(args: argparse.Namespace) -> int:
    engine = _engine(args)
    try:
        revision = migrate.current(engine)
    finally:
        engine.dispose()
    newest = migrate.head()
    state = "up to date" if revision == newest else "behind: run `safeaccess-server db upgrade`"
    print(f"schema revision: {revision or '(empty database)'}; this server: {newest} ({state})")
    return EXIT_OK


def _upgrade(args: argparse.Namespace) -> int:
    engine = _engine(args)
    try:
        before, after = migrate.upgrade(engine)
    finally:
        engine.dispose()
    if before == after:
        print(f"schema revision {after}: already up to date")
    else:
        print(f"schema upgraded from {before or '(empty database)'} to {after}")
    return EXIT_OK


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add the `db` command group to the CLI's subparsers."""
    db = sub.add_parser("db", help="the database schema").add_subparsers(
        dest="db_command", required=True, metavar="ACTION"
    )
    db.add_parser(
        "current", parents=[common], help="the schema revision of the database"
    ).set_defaults(handler=_current)
    db.add_parser(
        "upgrade",
        parents=[common],
        help="migrate the database to this server's schema (back it up first; stop every server)",
    ).set_defaults(handler=_upgrade)
