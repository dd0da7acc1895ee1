"""Database URLs as SQLAlchemy reads them (kept in the store, the only package that speaks SQL,
and free of the rest of it: `config.initialise` checks a URL before any store exists)."""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError


def is_database_url(url: str) -> bool:
    """Whether SQLAlchemy can read `url` as a database URL (nothing is connected to)."""
    try:
        make_url(url)
    except ArgumentError:
        return False
    return True


def redacted(url: str) -> str:
    """A database URL without its password, for printing."""
    return make_url(url).render_as_string(hide_password=True)


def is_url_error(exc: Exception) -> bool:
    """Whether `exc` is SQLAlchemy's refusal of a string that is no database URL."""
    return isinstance(exc, ArgumentError)
