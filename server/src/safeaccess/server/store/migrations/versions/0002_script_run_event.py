"""Steps hold a script run's log record until a checker first acts on the step."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("run_event", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("run_event")
