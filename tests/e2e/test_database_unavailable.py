"""A request that loses its database connection (PostgreSQL restarting, a failover) answers
503 with Retry-After, which the clients retry, instead of a 500; any other database error
stays a server error."""

from __future__ import annotations

from typing import NoReturn

import httpx
import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service


def _raises(error: Exception) -> object:
    def fail(*_args: object, **_kwargs: object) -> NoReturn:
        raise error

    return fail


def test_a_lost_database_connection_answers_503_to_retry(
    server: tuple[Service, EmbeddedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, srv = server
    lost = OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    monkeypatch.setattr(service.store, "key_status", _raises(lost))
    response = httpx.get(f"{srv.url}/v1/keys/{'0' * 64}")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert response.json()["error"]["code"] == "unavailable"
    # What the driver said stays in the server's log, not in the answer.
    assert "closed the connection" not in response.text


def test_another_database_error_is_a_server_error(
    server: tuple[Service, EmbeddedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, srv = server
    broken = IntegrityError("INSERT", {}, Exception("duplicate key"))
    monkeypatch.setattr(service.store, "key_status", _raises(broken))
    response = httpx.get(f"{srv.url}/v1/keys/{'0' * 64}")
    assert response.status_code == 500
    assert "duplicate key" not in response.text
