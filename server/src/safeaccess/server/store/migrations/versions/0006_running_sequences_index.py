"""An index on sequences.state: each API replica running steps itself looks for the running
sequences every few seconds (`steps/orphans.py`), which must stay a lookup of those few however
many sequences a centre has recorded.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.create_index("ix_sequences_state", "sequences", ["state"])


def downgrade() -> None:
    op.drop_index("ix_sequences_state", table_name="sequences")
