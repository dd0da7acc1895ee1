"""A signed request's failure limits and its claimed key in one read (`Authenticator`, with the
database's limiter): one statement before the signature is checked, and everything the two reads
did still holds: a rotated key counts from the next request, an unknown name fails like a bad
signature, a key or address past its limit gets 429 for its failures (never for a valid
signature), and an auditor's name is looked up among auditors only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import event

from safeaccess.client.httpsig import sign_request
from safeaccess.client.keys import fingerprint, public_key_text
from safeaccess.server.auth import Authenticator, SignedRequest
from safeaccess.server.config import ServerConfig
from safeaccess.server.errors import Unauthenticated
from safeaccess.server.ratelimit import DatabaseFailureLimiter, Limit, TooManyFailures
from safeaccess.server.store import Store, catalogue

SERVER = "one-read"
ADDRESS = "192.0.2.7"


@pytest.fixture
def store(tmp_path: Path) -> Any:
    store = Store(f"sqlite:///{tmp_path / 'auth.db'}")
    store.add_project("p1")
    yield store
    store.close()


def _authenticator(store: Store, kind: str = "researcher") -> Authenticator:
    config = ServerConfig(server_id=SERVER)
    limiter = DatabaseFailureLimiter(store, per_key=Limit(3, 300.0), per_address=Limit(50, 300.0))
    return Authenticator(kind, store, config, limiter)  # type: ignore[arg-type]


def _call(auth: Authenticator, key: Ed25519PrivateKey, name: str) -> str:
    body = b'{"x": 1}'
    headers = sign_request("POST", "/v1/sequences", "", body, key, name, server=SERVER)
    return auth.authenticate(SignedRequest("POST", "/v1/sequences", "", headers, body, ADDRESS))


def _register(store: Store, name: str, key: Ed25519PrivateKey) -> None:
    pub = key.public_key()
    store.add_researcher(name, public_key_text(pub), fingerprint(pub), ["p1"])


def test_the_limits_and_the_key_are_one_statement(store: Store) -> None:
    key = Ed25519PrivateKey.generate()
    _register(store, "ada", key)
    auth = _authenticator(store)
    reads: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            reads.append(statement)

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        assert _call(auth, key, "ada") == "ada"
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
    assert len(reads) == 1, reads
    assert "auth_failures" in reads[0] and "researchers" in reads[0]


def test_a_rotated_key_counts_from_the_next_request(store: Store) -> None:
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    _register(store, "ada", old)
    auth = _authenticator(store)
    assert _call(auth, old, "ada") == "ada"
    pub = new.public_key()
    catalogue.change_researcher_key(
        store, "ada", public_key_text(pub), fingerprint(pub), server_id=SERVER, reason="lost laptop"
    )
    with pytest.raises(Unauthenticated):
        _call(auth, old, "ada")
    assert _call(auth, new, "ada") == "ada"


def test_an_unknown_name_fails_like_a_bad_signature(store: Store) -> None:
    key = Ed25519PrivateKey.generate()
    _register(store, "ada", key)
    auth = _authenticator(store)
    with pytest.raises(Unauthenticated) as unknown:
        _call(auth, key, "nobody")
    with pytest.raises(Unauthenticated) as wrong:
        _call(auth, Ed25519PrivateKey.generate(), "ada")
    assert unknown.value.message == wrong.value.message


def test_past_its_limit_a_key_id_throttles_failures_not_her_valid_requests(store: Store) -> None:
    key = Ed25519PrivateKey.generate()
    _register(store, "ada", key)
    auth = _authenticator(store)
    for _ in range(3):
        with pytest.raises(Unauthenticated):
            _call(auth, Ed25519PrivateKey.generate(), "ada")
    with pytest.raises(TooManyFailures):
        _call(auth, Ed25519PrivateKey.generate(), "ada")  # a further forgery: throttled
    # Issue 41: her own valid signature is served while the limit holds (a forger naming her
    # key id must not lock her out).
    assert _call(auth, key, "ada") == "ada"


def test_an_auditor_is_looked_up_among_auditors_only(store: Store) -> None:
    key = Ed25519PrivateKey.generate()
    _register(store, "ada", key)  # a researcher, not an auditor
    auditors = _authenticator(store, "auditor")
    with pytest.raises(Unauthenticated):
        _call(auditors, key, "ada")
    pub = key.public_key()
    store.add_auditor("ada", public_key_text(pub), fingerprint(pub))
    assert _call(auditors, key, "ada") == "ada"
