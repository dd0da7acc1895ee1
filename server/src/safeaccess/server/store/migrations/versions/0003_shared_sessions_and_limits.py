"""Review sessions and authentication failures in the database, so API replicas share them.

`web_sessions` holds the review workspace's sessions (keyed by the SHA-256 of the cookie, never
the cookie); `auth_failures` holds the failures the login and signed-request limiters count
(subjects hashed). Both start empty: sessions held in a process's memory before this revision
end with that process, as they always did at a restart.

`sequences.state` grows from 16 to 32 characters: `awaiting_approval` (17) did not fit, which
PostgreSQL refused (SQLite does not check lengths), so a sequence past its withhold budget
could not be opened on PostgreSQL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def _state_length(old: int, new: int) -> None:
    with op.batch_alter_table("sequences", schema=None) as batch_op:
        batch_op.alter_column(
            "state",
            existing_type=sa.String(length=old),
            type_=sa.String(length=new),
            existing_nullable=False,
        )


def upgrade() -> None:
    _state_length(16, 32)

    op.create_table(
        "web_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("checker", sa.String(length=128), nullable=True),
        sa.Column("csrf", sa.String(length=64), nullable=False),
        sa.Column("flash", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("seen_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("web_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_web_sessions_checker"), ["checker"], unique=False)
        batch_op.create_index(batch_op.f("ix_web_sessions_seen_at"), ["seen_at"], unique=False)

    op.create_table(
        "auth_failures",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("limiter", sa.String(length=32), nullable=False),
        sa.Column("subject", sa.String(length=64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("auth_failures", schema=None) as batch_op:
        batch_op.create_index("ix_auth_failures_at", ["limiter", "at"], unique=False)
        batch_op.create_index(
            "ix_auth_failures_subject_at", ["limiter", "subject", "at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("auth_failures", schema=None) as batch_op:
        batch_op.drop_index("ix_auth_failures_subject_at")
        batch_op.drop_index("ix_auth_failures_at")
    op.drop_table("auth_failures")

    with op.batch_alter_table("web_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_web_sessions_seen_at"))
        batch_op.drop_index(batch_op.f("ix_web_sessions_checker"))
    op.drop_table("web_sessions")

    _state_length(32, 16)
