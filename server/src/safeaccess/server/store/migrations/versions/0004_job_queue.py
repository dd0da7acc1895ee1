"""The job queue: procrastinate's tables and functions, on PostgreSQL.

API replicas with `execution = "queue"` defer each step's job into `procrastinate_jobs` in the
transaction that records the step as running; `safeaccess-server worker` hosts claim and run
them. The schema is procrastinate's own (`procrastinate/sql/schema.sql` of the pinned release).
SQLite (the embedded single-host server) runs steps in process and gets nothing.
"""

from __future__ import annotations

from alembic import op

from safeaccess.server.store.queue import install_schema, uninstall_schema

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    install_schema(op.get_bind())


def downgrade() -> None:
    # The queue's jobs go with its tables: downgrade with every worker and replica stopped.
    uninstall_schema(op.get_bind())
