"""A failed job is one log line with its cause, carrying its sequence id and step; its
traceback only at debug level (`jobs/tasks.py`, `logs.py`)."""

from __future__ import annotations

import io
import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("procrastinate")

from safeaccess.server import logs
from safeaccess.server.errors import Unavailable
from safeaccess.server.jobs.tasks import _reported


def _failing_job(level: str) -> list[dict[str, Any]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.ContextFilter())
    handler.setFormatter(logs.JsonLines())
    logger = logging.getLogger("safeaccess")
    old = (logger.handlers[:], logger.level, logger.propagate)
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
    context: Any = SimpleNamespace(job=SimpleNamespace(attempts=1))
    try:
        with pytest.raises(Unavailable), _reported(context, "job", "a" * 32, 3):
            raise Unavailable("dataset census v1 is not readable on this worker's storage")
    finally:
        logger.handlers[:], level_, logger.propagate = old[0], old[1], old[2]
        logger.setLevel(level_)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_failed_job_is_one_line_with_its_cause_and_ids() -> None:
    (line,) = _failing_job("info")
    assert line["level"] == "error"
    assert line["message"] == (
        f"job {'a' * 32} step 3 failed (run 2): Unavailable: dataset census v1 is not readable "
        "on this worker's storage"
    )
    assert line["sequence_id"] == "a" * 32 and line["step"] == 3
    assert "traceback" not in line


def test_its_traceback_is_logged_at_debug_level() -> None:
    error, debug = _failing_job("debug")
    assert "traceback" not in error
    assert debug["level"] == "debug" and "Traceback (most recent call last)" in debug["traceback"]
    assert debug["sequence_id"] == "a" * 32 and debug["step"] == 3
