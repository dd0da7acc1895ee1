"""Issue 26, point 7: authentication failures are logged with their cause (never a secret) and
rate-limited per claimed key id and per client address, through the real server."""

from __future__ import annotations

import logging

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Centre, signed

from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.ratelimit import Limit, MemoryFailureLimiter
from safeaccess.server.service import Service


def test_failures_are_logged_and_limited_per_key_and_per_address(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    service, srv = server
    service.auth_limiter = MemoryFailureLimiter(Limit(3, 60.0), Limit(5, 60.0))
    forger = Ed25519PrivateKey.generate()
    caplog.set_level(logging.INFO, logger="safeaccess")

    def get(key: Ed25519PrivateKey, name: str) -> httpx.Response:
        return signed(srv.url, key, name, "GET", "/v1/datasets")

    failures = [get(forger, "ada") for _ in range(3)]
    assert [r.status_code for r in failures] == [401, 401, 401]
    # Her key id is now past its limit: refused before any signature is checked, even signed
    # with her real key, with the time to wait.
    limited = get(centre.keys["ada"], "ada")
    assert limited.status_code == 429, limited.text
    assert limited.json()["error"]["code"] == "too_many_failures"
    assert 0 < int(limited.headers["Retry-After"]) <= 60
    # Another key from the same address still works (the address has 3 failures of 5).
    assert get(centre.keys["bob"], "bob").status_code == 200
    # Two more failures under made-up names: the address itself is past its limit.
    assert get(forger, "mallory").status_code == 401
    assert get(forger, "trudy").status_code == 401
    assert get(centre.keys["bob"], "bob").status_code == 429

    logged = caplog.text
    assert "authentication failed (signature_invalid) for key id 'ada' from 127.0.0.1" in logged
    assert "too many failures (key id 'ada', address 127.0.0.1)" in logged
    # No signature, nonce or digest in the log.
    for response in failures:
        sent = response.request.headers
        assert sent["signature"] not in logged
        assert sent["content-digest"] not in logged
