"""The server's log: plain text by default, JSON lines with `--log-format json`.

Every line carries what it is about, from context variables set where the work starts:

- `request_id`: each HTTP request's id (`RequestIds`), taken from a well-formed
  `X-Request-ID` header (HAProxy or the client may set one) or made here, and returned in the
  reply's `X-Request-ID`; a line logged while serving the request, in any thread the request
  uses, carries it;
- `sequence_id` and `step`: set while a step is revealed, computed or recorded, in a replica
  or in a worker's job (`step_context`).

A job that fails is logged in one line with its cause; its traceback only at debug level
(`--log-level debug`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from datetime import UTC, datetime
from typing import Any, Literal

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LogFormat = Literal["text", "json"]

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
SEQUENCE_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "sequence_id", default=None
)
STEP: contextvars.ContextVar[int | None] = contextvars.ContextVar("step", default=None)

#: An incoming X-Request-ID is used only if it looks like an id (no spaces, quotes or newlines
#: that could forge log lines), else one is made here.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
#: The loggers configured here: the server's own, procrastinate's, uvicorn's.
LOGGERS = ("safeaccess", "procrastinate", "uvicorn", "uvicorn.error", "uvicorn.access")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(context)s"


@contextlib.contextmanager
def step_context(sequence_id: str, index: int | None) -> Iterator[None]:
    """Every line logged inside carries this sequence id and step index."""
    seq_token = SEQUENCE_ID.set(sequence_id)
    step_token = STEP.set(index)
    try:
        yield
    finally:
        STEP.reset(step_token)
        SEQUENCE_ID.reset(seq_token)


class ContextFilter(logging.Filter):
    """Puts the request id, sequence id and step index on each record (None when unset), and
    a text suffix of those that are set for the plain format."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = {"request_id": REQUEST_ID.get(), "sequence_id": SEQUENCE_ID.get(), "step": STEP.get()}
        for field, value in ids.items():
            setattr(record, field, value)
        parts = [
            f"{field.removesuffix('_id')}={value}"
            for field, value in ids.items()
            if value is not None
        ]
        record.context = f" [{' '.join(parts)}]" if parts else ""
        return True


class JsonLines(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context ids that are set,
    and the traceback (if the record has one) as a string field."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in ("request_id", "sequence_id", "step"):
            value = getattr(record, field, None)
            if value is not None:
                line[field] = value
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class StderrHandler(logging.StreamHandler):
    """A handler on whatever `sys.stderr` is when a record is emitted, not the stream it was at
    configuration: a process that redirects standard error later (a test's capture, a command
    run in-process after `serve`) must not find its log lines written to a closed stream."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always the current standard error


def configure(log_format: LogFormat = "text", level: str = "info") -> None:
    """One handler on standard error for the server's, procrastinate's and uvicorn's loggers
    (replacing any they had), in the chosen format, with the context filter."""
    handler = StderrHandler()
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonLines() if log_format == "json" else logging.Formatter(TEXT))
    numeric = logging.getLevelName(level.upper())
    for name in LOGGERS:
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.propagate = False
    logging.getLogger("safeaccess").setLevel(numeric)
    # procrastinate is chatty at info (each job's start and end): its warnings and errors.
    logging.getLogger("procrastinate").setLevel(max(numeric, logging.WARNING))
    logging.getLogger("uvicorn").setLevel(numeric)


class RequestIds:
    """ASGI middleware: a request id for each HTTP request (see the module's docstring)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next(
            (v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"x-request-id"),
            "",
        )
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
