"""Typed service errors. Each carries a machine-readable code and the HTTP status it maps to."""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error the API reports to a caller as {"error": {"code", "message"}}."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidRequest(ServiceError):
    status = 400
    code = "invalid_request"


class Unauthenticated(ServiceError):
    status = 401
    code = "unauthenticated"


class Forbidden(ServiceError):
    status = 403
    code = "forbidden"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Conflict(ServiceError):
    """The request is well formed but the sequence is not in a state that allows it."""

    status = 409
    code = "conflict"


class ProtocolRejected(ServiceError):
    """The header, signature or a trace did not verify."""

    status = 422
    code = "protocol_rejected"


class PayloadTooLarge(ServiceError):
    status = 413
    code = "payload_too_large"


class Unavailable(ServiceError):
    """A temporary failure of the centre (e.g. the sandbox); the same request may be retried."""

    status = 503
    code = "unavailable"


class LogDamaged(ServiceError):
    """The audit log's store lacks what a root or proof needs (a row deleted or altered under
    the server): no checkpoint can be signed over it. The message names the entry first
    (`entry N: ...`), so an auditor's verifier reports it like any other bad entry."""

    status = 500
    code = "audit_log_damaged"

    def __init__(self, entry: int, message: str):
        super().__init__(f"entry {entry}: {message}")
        self.entry = entry


class ConfigError(Exception):
    """The server configuration or data directory is unusable; the message says how to fix it."""
