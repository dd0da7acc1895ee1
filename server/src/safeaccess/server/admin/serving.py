"""The admin commands that set up and run a centre: `init` (a data directory, its key and its
database, all or nothing), `serve`, `worker` and `demo`. Rows of the CLI's table (`cli.py`):
each function takes the command's `Centre` and arguments and returns its exit code.
"""

from __future__ import annotations

import argparse
from typing import Any

from safeaccess.server.admin.table import EXIT_OK, USER_ERRORS, Centre
from safeaccess.server.config import DataDir, initialise
from safeaccess.server.errors import ConfigError
from safeaccess.server.store import Store
from safeaccess.server.store.urls import is_url_error, redacted


def _database_problem(url: str, exc: Exception) -> ConfigError:
    """A database `init` cannot use, in one line with what to do."""
    if is_url_error(exc):
        return ConfigError(
            "--database-url is not a database URL (e.g. postgresql+psycopg://user@host/safeaccess)"
        )
    if isinstance(exc, ModuleNotFoundError):
        return ConfigError(
            f"the database driver is not installed ({exc.name}): install the server with its "
            "postgresql extra, e.g. pip install 'safeaccess-server[postgresql]'"
        )
    text = str(getattr(exc, "orig", None) or exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    hint = ""
    if "no password supplied" in first or "password authentication failed" in first:
        hint = (
            "; give the password in a libpq password file (mode 0600) and set PGPASSFILE to it "
            "before running init (docs/deploy.md, step 3)"
        )
    return ConfigError(f"cannot use the database {redacted(url)}: {first}{hint}")


def init(centre: Centre, args: argparse.Namespace) -> int:
    """Create the data directory, its key and its database's schema: all of them, or, when
    any step fails, none (a retry then starts afresh instead of "already initialised")."""
    data = centre.data
    if args.database_url is not None and not (data.config_path.exists() or data.key_path.exists()):
        # Reach the database before anything is written: the commonest failure (no password,
        # a wrong host) then leaves nothing behind to clean up.
        _probe_database(args.database_url)
    existed = data.root.exists()
    config = initialise(data.root, server_id=args.server_id, database_url=args.database_url)
    try:
        Store(data.database_url(data.load_config())).close()
    except Exception as exc:
        _undo_init(data, existed)
        url = data.database_url(config)
        if isinstance(exc, USER_ERRORS):
            raise
        raise _database_problem(url, exc) from exc
    print(f"initialised {data.root}")
    print(f"  database:    {redacted(data.database_url(config))}")
    print(f"  server id:   {config.server_id}")
    print(f"  config:      {data.config_path} (sandbox backend: {config.sandbox.backend})")
    print(f"  signing key: {data.key_path} (mode 0600)")
    return EXIT_OK


def _probe_database(url: str) -> None:
    """Connect to the database at `url` once, or raise a one-line ConfigError."""
    from safeaccess.server.store.reachable import probe

    try:
        probe(url)
    except Exception as exc:
        raise _database_problem(url, exc) from exc


def _undo_init(data: DataDir, existed: bool) -> None:
    """Remove what a failed `init` created: its config, its key, its empty folders (a SQLite
    database it made goes too, with the folder it is in)."""
    import contextlib
    import shutil

    for path in (data.config_path, data.key_path):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if not existed:
        shutil.rmtree(data.root, ignore_errors=True)
        return
    with contextlib.suppress(OSError):
        data.datasets.rmdir()  # only if empty


def _log_to_stderr(args: argparse.Namespace) -> None:
    """The server's own log (authentication failure causes, step outcomes), procrastinate's and
    uvicorn's to standard error, as text or JSON lines (`logs.py`)."""
    from safeaccess.server import logs

    logs.configure(args.log_format, args.log_level)


def serve(centre: Centre, args: argparse.Namespace) -> int:
    import uvicorn

    from safeaccess.server import shutdown
    from safeaccess.server.steps.orphans import StartupResume

    class _StoppingServer(uvicorn.Server):
        """uvicorn, whose stop signal also interrupts running admissions and arms the
        watchdog that ends the process within `shutdown.GRACE_SECONDS` (`shutdown.py`)."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            shutdown.begin()
            super().handle_exit(sig, frame)

    from safeaccess.server.heap import freeze_startup_objects
    from safeaccess.server.http.app import create_app
    from safeaccess.server.readiness import sandbox_mode
    from safeaccess.server.service import Service

    _log_to_stderr(args)
    service = Service(centre.data.root)
    print(
        f"safeaccess server {service.server_id} on http://{args.host}:{args.port} "
        f"(sandbox: {service.backend.name}, mode {sandbox_mode(service.backend)})",
        flush=True,
    )
    try:
        app = create_app(service)
        freeze_startup_objects()
        if service.orphans is None and service.config.execution == "local":
            # one server owns this database (SQLite): the steps its last run left running
            # (stopped or crashed mid-step) are run again now (PostgreSQL: the orphan sweeper)
            StartupResume(service.flow)
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            # None: uvicorn keeps the handlers `_log_to_stderr` set (text or JSON)
            log_config=None,
            # requests still running this long after SIGTERM are cancelled
            timeout_graceful_shutdown=int(shutdown.GRACE_SECONDS // 2),
        )
        _StoppingServer(config).run()
    finally:
        service.close()
    return EXIT_OK


def worker(centre: Centre, args: argparse.Namespace) -> int:
    from safeaccess.server.jobs.worker import WorkerOptions, run_worker

    _log_to_stderr(args)
    queues = tuple(q.strip() for q in args.queues.split(",") if q.strip())
    if not queues:
        raise ConfigError("--queues needs at least one queue, e.g. steps,scripts")
    run_worker(
        centre.data.root,
        WorkerOptions(
            slots=args.slots,
            script_slots=args.script_slots,
            backend=args.backend,
            queues=queues,
            name=args.name,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
        ),
    )
    return EXIT_OK


def demo(_centre: Centre, args: argparse.Namespace) -> int:
    from safeaccess.server.demo.run import run_demo

    return run_demo(args.data_dir, rows=args.rows)
