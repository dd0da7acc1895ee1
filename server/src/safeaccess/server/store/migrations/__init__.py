"""The schema's Alembic migrations (`env.py`, `versions/`); run through `store.migrate`."""
