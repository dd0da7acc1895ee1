"""Typed service errors. Each carries a machine-readable code and the HTTP status it maps to."""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error the API reports to a caller as {"error": {"code", "message"}}.

    A subclass names its HTTP status and default code in its class line
    (`class NotFound(ServiceError, status=404, code="not_found")`): one line each, not a body
    of two assignments repeated for every kind of error."""

    status = 400
    code = "bad_request"

    def __init_subclass__(cls, *, status: int | None = None, code: str | None = None) -> None:
        super().__init_subclass__()
        if status is not None:
            cls.status = status
        if code is not None:
            cls.code = code

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidRequest(ServiceError, status=400, code="invalid_request"):
    pass


class Unauthenticated(ServiceError, status=401, code="unauthenticated"):
    pass


class Forbidden(ServiceError, status=403, code="forbidden"):
    pass


class NotFound(ServiceError, status=404, code="not_found"):
    pass


class Conflict(ServiceError, status=409, code="conflict"):
    """The request is well formed but the sequence is not in a state that allows it."""


class ProtocolRejected(ServiceError, status=422, code="protocol_rejected"):
    """The header, signature or a trace did not verify."""


class PayloadTooLarge(ServiceError, status=413, code="payload_too_large"):
    pass


class Unavailable(ServiceError, status=503, code="unavailable"):
    """A temporary failure of the centre (e.g. the sandbox); the same request may be retried."""


class LogDamaged(ServiceError, status=500, code="audit_log_damaged"):
    """The audit log's store lacks what a root or proof needs (a row deleted or altered under
    the server): no checkpoint can be signed over it. The message names the entry first
    (`entry N: ...`), so an auditor's verifier reports it like any other bad entry."""

    def __init__(self, entry: int, message: str):
        super().__init__(f"entry {entry}: {message}")
        self.entry = entry


class ConfigError(Exception):
    """The server configuration or data directory is unusable; the message says how to fix it."""
