"""The queue's claim with dataset affinity (`store/affinity.py`): a PostgreSQL function beside
procrastinate's own; SQLite (no queue) gets nothing.
"""

from __future__ import annotations

from alembic import op

from safeaccess.server.store.affinity import install_claim, uninstall_claim

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    install_claim(op.get_bind())


def downgrade() -> None:
    uninstall_claim(op.get_bind())
