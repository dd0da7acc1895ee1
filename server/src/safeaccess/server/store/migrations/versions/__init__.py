"""One module per schema revision, oldest first (`0001_baseline`: the schema before Alembic)."""
