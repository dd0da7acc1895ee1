"""Errors of the synthetic-data disclosure checks."""

from __future__ import annotations


class SyntheticCheckError(ValueError):
    """The input to a synthetic-data check is malformed; the message says what to fix."""
