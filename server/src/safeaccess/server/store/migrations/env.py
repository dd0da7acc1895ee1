"""Alembic's environment: migrations run on the connection `store.migrate` hands over.

`store.migrate` opens the engine (with the store's SQLite pragmas) and passes a connection in
`config.attributes["connection"]`, so no URL or logging configuration lives here.
"""

from __future__ import annotations

from alembic import context

from safeaccess.server.store.queue import include_name
from safeaccess.server.store.schema import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite cannot ALTER most things in place: batch mode copies the table instead.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
    # The job queue's tables are procrastinate's (migration 0004 installs them), not models.
    include_name=include_name,
)
with context.begin_transaction():
    context.run_migrations()
