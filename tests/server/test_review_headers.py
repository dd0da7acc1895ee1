"""The review workspace's security headers: on every response under /review (a page, a
redirect, an error), and never put on the API's replies, which pass the middleware untouched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from safeaccess.server.config import initialise
from safeaccess.server.http.app import create_app
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.service import Service
from safeaccess.server.web.routes import SECURITY_HEADERS


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = Path(tmp_path_factory.mktemp("headers")) / "data"
    initialise(root, server_id="headers")
    with Service(root) as service, EmbeddedServer(create_app(service)) as server:
        yield server.url


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/review/login", 200),  # a page
        ("/review/", 303),  # not logged in: sent to the login page
        ("/review/no-such-page", 404),  # an error
    ],
)
def test_every_review_response_carries_the_security_headers(
    url: str, path: str, status: int
) -> None:
    response = httpx.get(url + path, follow_redirects=False)
    assert response.status_code == status
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get(name) == value, name


def test_the_api_and_a_path_that_only_starts_alike_get_none(url: str) -> None:
    for path in ("/v1/health", "/reviewer"):
        response = httpx.get(url + path)
        assert "content-security-policy" not in response.headers, path
        assert "x-frame-options" not in response.headers, path
    assert httpx.get(url + "/v1/health").status_code == 200
