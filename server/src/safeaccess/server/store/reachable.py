"""Whether a database answers: the readiness check's, and `init`'s before it writes anything."""

from __future__ import annotations

from sqlalchemy import Engine, create_engine, text


def ping(engine: Engine) -> None:
    """One round trip on `engine` (raises what the driver raises if the database is away)."""
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))


def probe(url: str) -> None:
    """Connect to the database at `url` once, on an engine of its own (raises what the
    driver raises: a missing driver, a refused connection, a missing password...)."""
    engine = create_engine(url)
    try:
        ping(engine)
    finally:
        engine.dispose()
