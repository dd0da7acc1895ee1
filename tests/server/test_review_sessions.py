"""Sessions (idle timeout, absolute lifetime, new id at login) and the login failure limiter of
the review workspace, kept in the database, on a controlled clock; on SQLite and PostgreSQL.
Two `SessionStore`s / limiters over one database stand for two replicas."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from safeaccess.server.admin import accounts as admin_accounts
from safeaccess.server.store import Store
from safeaccess.server.store.schema import AuthFailureRow, WebSessionRow
from safeaccess.server.web import accounts, ratelimit, sessions
from safeaccess.server.web.csrf import valid


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        url = request.getfixturevalue("postgres_database")
    s = Store(url)
    yield s
    s.close()


def _sessions(store: Store, clock: Clock) -> sessions.SessionStore:
    return sessions.SessionStore(store, idle_seconds=60, absolute_seconds=300, clock=clock)


def _rows(store: Store) -> list[WebSessionRow]:
    with store.transaction() as s:
        return list(s.scalars(select(WebSessionRow)))


def test_idle_timeout_and_absolute_lifetime(store: Store, clock: Clock) -> None:
    one, other = _sessions(store, clock), _sessions(store, clock)
    s = one.new("olivia")
    for i in range(4):  # kept alive by use, on either replica...
        clock.now += 59
        seen, expired = (one if i % 2 else other).get(s.id)
        assert seen is not None and not expired
        assert (seen.id, seen.csrf, seen.checker) == (s.id, s.csrf, "olivia")
    clock.now += 70  # ...but not past its lifetime (296 + 70 s after login)
    assert other.get(s.id) == (None, True)
    idle = one.new("olivia")
    clock.now += 61
    assert other.get(idle.id) == (None, True)
    assert one.get(idle.id) == (None, False)  # gone for good, on every replica
    assert one.get("made-up") == (None, False)
    anonymous = one.new()
    clock.now += 61
    assert one.get(anonymous.id) == (None, False)  # nobody was logged in: nothing to report


def test_only_a_hash_of_the_cookie_is_stored(store: Store, clock: Clock) -> None:
    web = _sessions(store, clock)
    a, b = web.new(), web.new("olivia")
    stored = {r.id: r for r in _rows(store)}
    assert set(stored) == {hashlib.sha256(x.id.encode()).hexdigest() for x in (a, b)}
    for row in stored.values():
        for value in (row.id, row.checker, row.csrf, *row.flash):
            assert value is None or (a.id not in value and b.id not in value)


def test_ids_and_csrf_tokens_are_random_and_bound_to_their_session(
    store: Store, clock: Clock
) -> None:
    web = _sessions(store, clock)
    a, b = web.new(), web.new("olivia")
    assert len({a.id, b.id, a.csrf, b.csrf}) == 4 and len(a.id) >= 43
    assert valid(a, a.csrf) and not valid(a, b.csrf) and not valid(None, a.csrf)
    assert not valid(a, "") and not valid(a, None)
    # the token a replica reads back is the one issued, so a form from one replica is valid
    # on the other
    again, _ = _sessions(store, clock).get(a.id)
    assert again is not None and valid(again, a.csrf) and not valid(again, b.csrf)
    web.end_checker("olivia")
    assert web.get(b.id)[0] is None and web.get(a.id)[0] is not None


def test_flash_messages_reach_the_next_page_on_any_replica(store: Store, clock: Clock) -> None:
    one, other = _sessions(store, clock), _sessions(store, clock)
    s = one.new("olivia")
    one.add_flash(s, "step 2 released")
    seen, _ = other.get(s.id)
    assert seen is not None and other.take_flash(seen) == ["step 2 released"]
    again, _ = one.get(s.id)
    assert again is not None and again.flash == []  # shown once


def test_disabling_or_removing_a_checker_ends_her_sessions_everywhere(
    store: Store, clock: Clock
) -> None:
    one, other = _sessions(store, clock), _sessions(store, clock)
    for name in ("olivia", "peter"):
        accounts.add_checker(store, name)
    olivia = [one.new("olivia"), other.new("olivia")]
    peter = [one.new("peter"), other.new("peter")]
    anonymous = one.new()
    accounts.disable_checker(store, "olivia")
    assert [one.get(s.id)[0] for s in olivia] == [None, None]
    assert all(other.get(s.id)[0] is not None for s in [*peter, anonymous])
    admin_accounts.remove_checker(store, "peter")
    assert [one.get(s.id)[0] for s in peter] == [None, None]
    assert {r.checker for r in _rows(store)} == {None}


def test_expired_rows_are_purged(store: Store, clock: Clock) -> None:
    web = _sessions(store, clock)
    old = [web.new("olivia"), web.new()]
    clock.now += sessions.PURGE_EVERY + 61  # idle past the timeout; nobody came back
    fresh = web.new()  # making a session purges what has expired
    assert {r.id for r in _rows(store)} == {hashlib.sha256(fresh.id.encode()).hexdigest()}
    assert all(web.get(s.id) == (None, False) for s in old)


def test_failures_are_limited_in_a_sliding_window(store: Store, clock: Clock) -> None:
    one = ratelimit.FailureLimiter(store, "login-account", limit=3, window_seconds=100, clock=clock)
    other = ratelimit.FailureLimiter(
        store, "login-account", limit=3, window_seconds=100, clock=clock
    )
    for limiter in (one, other, one):  # failures on either replica count on both
        assert other.retry_after("acct:olivia") == 0
        limiter.fail("acct:olivia")
        clock.now += 10
    assert one.retry_after("acct:olivia") == 70  # when the first failure leaves the window
    assert other.retry_after("acct:olivia") == 70
    assert other.retry_after("acct:peter") == 0
    address = ratelimit.FailureLimiter(store, "login-address", 3, 100, clock=clock)
    assert address.retry_after("acct:olivia") == 0  # another limiter's rows are not counted
    clock.now += 71
    assert other.retry_after("acct:olivia") == 0
    one.fail("acct:olivia")
    other.clear("acct:olivia")
    assert one.retry_after("acct:olivia") == 0


def test_failure_rows_name_nobody_and_leave_with_their_window(store: Store, clock: Clock) -> None:
    limiter = ratelimit.FailureLimiter(
        store, "login-account", limit=3, window_seconds=100, clock=clock
    )
    for name in ("acct:olivia", "acct:peter"):
        limiter.fail(name)
    with store.transaction() as s:
        subjects = list(s.scalars(select(AuthFailureRow.subject)))
    assert len(subjects) == 2 and not any("olivia" in x or "peter" in x for x in subjects)
    clock.now += 101
    limiter.fail("acct:quentin")  # a new failure takes the ones out of the window with it
    with store.transaction() as s:
        assert len(list(s.scalars(select(AuthFailureRow.id)))) == 1
