"""The queue's claim with dataset affinity (`store/affinity.py`): a PostgreSQL function beside
procrastinate's own; SQLite (no queue) gets nothing.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

from safeaccess.server.store.affinity import install_claim, uninstall_claim

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install_claim(op.get_bind())


def downgrade() -> None:
    uninstall_claim(op.get_bind())
