"""An index for the withhold budget, read for every step's view: a researcher's sequences by
(researcher, state). Her open sequences are found by it, and her withholds through her aborted
sequences (a withhold aborts its sequence). Without it the budget read every sequence and step
she ever had: 9.3 ms per read on SQLite at 6 000 sequences of 5 steps.
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.create_index("ix_sequences_researcher_state", "sequences", ["researcher", "state"])


def downgrade() -> None:
    op.drop_index("ix_sequences_researcher_state", table_name="sequences")
