"""Tables more than one migration creates: the baseline's `audit_nodes`, which migration 0008's
downgrade rebuilds, comes out the same both ways because both call this."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


def create_audit_nodes() -> None:
    """The audit log's Merkle nodes as the baseline had them (0008 moves them into the entries)."""
    op.create_table(
        "audit_nodes",
        sa.Column("level", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("idx", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("hash", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("level", "idx"),
    )
