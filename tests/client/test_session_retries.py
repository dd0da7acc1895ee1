"""Which failures a session's idempotent calls (a reveal, a step's state) retry: a load
balancer's 502 and 504 (its replica died or stalled under the request), the server's 503 and
lost races; never another error, which would be answered the same again."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from safeaccess.client.session import ServerError, connect


def _failing_then(errors: list[ServerError]) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "answer"

    return calls, call


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_proxy_or_server_unavailable_answer_is_retried(status: int) -> None:
    with connect("http://127.0.0.1:9", Ed25519PrivateKey.generate(), "ada", retry_wait=0) as s:
        calls, call = _failing_then([ServerError(status, "http_error", "bad gateway")])
        assert s._retrying(call) == "answer"
        assert len(calls) == 2


@pytest.mark.parametrize("status", [400, 401, 409, 500])
def test_other_errors_are_not_retried(status: int) -> None:
    with connect("http://127.0.0.1:9", Ed25519PrivateKey.generate(), "ada", retry_wait=0) as s:
        calls, call = _failing_then([ServerError(status, "http_error", "no")])
        with pytest.raises(ServerError):
            s._retrying(call)
        assert len(calls) == 1


def test_retries_end_after_the_configured_number() -> None:
    key = Ed25519PrivateKey.generate()
    with connect("http://127.0.0.1:9", key, "ada", retries=2, retry_wait=0) as s:
        calls, call = _failing_then([ServerError(502, "http_error", "x")] * 5)
        with pytest.raises(ServerError):
            s._retrying(call)
        assert len(calls) == 3
