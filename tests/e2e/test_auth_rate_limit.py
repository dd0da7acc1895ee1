"""Issue 26, point 7: authentication failures are logged with their cause (never a secret) and
rate-limited per claimed key id and per client address, through the real server.

Issue 41, point 3: the limits throttle the failures, never a registered key's valid requests:
researchers behind one institution's address (its NAT or proxy) keep working while one client
at that address floods the server with malformed and badly signed requests, and a forger who
names a colleague's key id cannot lock her out."""

from __future__ import annotations

import logging

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import Centre, signed

from safeaccess.client.analyses import FrequencyTable
from safeaccess.client.session import connect
from safeaccess.server.http.embedded import EmbeddedServer
from safeaccess.server.ratelimit import DatabaseFailureLimiter, Limit, MemoryFailureLimiter
from safeaccess.server.service import Service


def _get(srv: EmbeddedServer, key: Ed25519PrivateKey, name: str) -> httpx.Response:
    return signed(srv.url, key, name, "GET", "/v1/datasets")


def test_failures_are_logged_and_limited_per_key_and_per_address(
    centre: Centre,
    server: tuple[Service, EmbeddedServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    service, srv = server
    service.auth_limiter = MemoryFailureLimiter(Limit(3, 60.0), Limit(5, 60.0))
    forger = Ed25519PrivateKey.generate()
    caplog.set_level(logging.INFO, logger="safeaccess")

    failures = [_get(srv, forger, "ada") for _ in range(3)]
    assert [r.status_code for r in failures] == [401, 401, 401]
    # The key id "ada" is past its limit: a further failure naming it is refused with the time
    # to wait ...
    limited = _get(srv, forger, "ada")
    assert limited.status_code == 429, limited.text
    assert limited.json()["error"]["code"] == "too_many_failures"
    assert 0 < int(limited.headers["Retry-After"]) <= 60
    # ... but her own key still signs valid requests: a forger cannot lock her out.
    assert _get(srv, centre.keys["ada"], "ada").status_code == 200
    assert _get(srv, centre.keys["bob"], "bob").status_code == 200
    # Two more failures under made-up names: the address itself is past its limit, and any
    # further failure from it is refused, under any name or none ...
    assert _get(srv, forger, "mallory").status_code == 401
    assert _get(srv, forger, "trudy").status_code == 401
    assert _get(srv, forger, "oscar").status_code == 429
    assert httpx.get(srv.url + "/v1/datasets", timeout=30).status_code == 429
    # ... while the registered keys at that address keep working.
    assert _get(srv, centre.keys["bob"], "bob").status_code == 200

    logged = caplog.text
    assert "authentication failed (signature_invalid) for key id 'ada' from 127.0.0.1" in logged
    # One line for the refusals from that address, not one per refused request.
    assert "too many failures (key id 'ada', address 127.0.0.1)" in logged
    assert "key id 'oscar'" not in logged
    # No signature, nonce or digest in the log.
    for response in failures:
        sent = response.request.headers
        assert sent["signature"] not in logged
        assert sent["content-digest"] not in logged


def test_the_throttle_does_not_tell_a_registered_name_from_an_unknown_one(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    service, srv = server
    service.auth_limiter = MemoryFailureLimiter(Limit(3, 60.0), Limit(1000, 60.0))
    forger = Ed25519PrivateKey.generate()
    answers = {
        name: [
            (r.status_code, r.json()["error"]["code"])
            for r in (_get(srv, forger, name) for _ in range(5))
        ]
        for name in ("bob", "nobody-here")
    }
    assert answers["bob"] == answers["nobody-here"]
    assert [status for status, _ in answers["bob"]] == [401, 401, 401, 429, 429]


def test_honest_researchers_behind_one_address_keep_working_while_one_floods_failures(
    centre: Centre, server: tuple[Service, EmbeddedServer]
) -> None:
    """The issue's incident, small: the deployed (database) limiter, one client at the honest
    researchers' address sending malformed requests, forged signatures naming them and
    made-up names, many times past every limit; the honest ones run steps in between."""
    service, srv = server
    per_key, per_address = Limit(4, 300.0), Limit(10, 300.0)
    service.auth_limiter = DatabaseFailureLimiter(service.store, per_key, per_address)
    forger = Ed25519PrivateKey.generate()
    honest = ("ada", "bob")

    def flood(rounds: int) -> list[int]:
        statuses = []
        for i in range(rounds):
            statuses.append(httpx.get(srv.url + "/v1/datasets", timeout=30).status_code)
            statuses.append(
                httpx.get(
                    srv.url + "/v1/datasets",
                    headers={"Signature-Input": "garbage", "Signature": "x"},
                    timeout=30,
                ).status_code
            )
            statuses.append(_get(srv, forger, honest[i % 2]).status_code)
            statuses.append(_get(srv, forger, f"made-up-{i}").status_code)
        return statuses

    first = flood(5)
    # Each failure is counted until the address reaches its limit; from then on the flooder
    # gets 429 (with its wait), never a 200.
    assert first[: per_address.failures] == [401] * per_address.failures
    assert set(first[per_address.failures :]) == {429}
    # The honest researchers at the same address keep working: valid requests, and a step.
    for name in honest:
        assert _get(srv, centre.keys[name], name).status_code == 200
    with connect(srv.url, centre.keys["ada"], "ada") as session:
        released = session.run(centre.seal([FrequencyTable(rows=["sex"])]))
    assert [r.released for r in released] == [True]
    assert set(flood(5)) == {429}
    with connect(srv.url, centre.keys["bob"], "bob") as session:
        assert session.datasets()
