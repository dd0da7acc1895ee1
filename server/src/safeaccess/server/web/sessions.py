"""Server-side sessions of the review workspace, kept in the database so every replica shares them.

The cookie holds only a random id (256 bits); the database keeps the SHA-256 of it, never the id,
with the checker, the CSRF token, the flash messages and two times. A session ends after
`idle_seconds` without a request or `absolute_seconds` after it began, whichever is first; both
are checked against the stored times on every request, whichever replica serves it. A session
starts anonymous (it carries the CSRF token of the login and enrolment forms) and gets a new id
when a checker logs in, so an id planted before login is worth nothing after it. Disabling or
removing a checker deletes her sessions in the same transaction (`web.accounts`,
`admin_accounts`): she is logged out on every replica at once. Expired rows are purged when new
sessions are made.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from safeaccess.server.store import Store
from safeaccess.server.store import web_sessions as rows

COOKIE = "safeaccess_review"
#: Seconds between two purges of expired rows by one process (each purge is one DELETE).
PURGE_EVERY = 60.0


@dataclass
class WebSession:
    """One request's view of a session; `id` is the cookie's value (never stored)."""

    id: str
    csrf: str
    created: float
    seen: float
    checker: str | None = None
    flash: list[str] = field(default_factory=list)


class SessionStore:
    """Sessions in the store's `web_sessions` table, on the wall clock `clock` (seconds since
    the epoch: replicas compare times each other wrote, so a per-process clock would not do)."""

    def __init__(
        self,
        store: Store,
        idle_seconds: float,
        absolute_seconds: float,
        clock: Callable[[], float] = time.time,
    ):
        self.store = store
        self.idle_seconds = idle_seconds
        self.absolute_seconds = absolute_seconds
        self._clock = clock
        self._purged_at: float | None = None
        self._purge_guard = threading.Lock()

    def get(self, session_id: str | None) -> tuple[WebSession | None, bool]:
        """(the live session, whether a session of this id just expired); touches it."""
        if not session_id:
            return None, False
        now = self._clock()
        with self.store.transaction() as s:
            row = rows.touch_live(
                s,
                session_id,
                now=now,
                idle_before=now - self.idle_seconds,
                created_before=now - self.absolute_seconds,
            )
            if row is not None:
                return (
                    WebSession(
                        id=session_id,
                        csrf=row.csrf,
                        created=row.created_at,
                        seen=row.seen_at,
                        checker=row.checker,
                        flash=list(row.flash),
                    ),
                    False,
                )
            # Not live: unknown, or expired (then it goes now, and a checker's is reported).
            gone = rows.take(s, session_id)
        return None, gone is not None and gone[0] is not None

    def new(self, checker: str | None = None) -> WebSession:
        """A new session (anonymous, or of a checker who just logged in)."""
        now = self._clock()
        session = WebSession(
            id=secrets.token_urlsafe(32),
            csrf=secrets.token_urlsafe(32),
            created=now,
            seen=now,
            checker=checker,
        )
        self._purge(now)
        with self.store.transaction() as s:
            rows.add(s, session.id, csrf=session.csrf, checker=checker, now=now)
        return session

    def end(self, session_id: str) -> None:
        with self.store.transaction() as s:
            rows.remove(s, session_id)

    def end_checker(self, checker: str) -> None:
        """End every session of a checker (on every replica: they share the table)."""
        with self.store.transaction() as s:
            rows.end_checker(s, checker)

    def add_flash(self, session: WebSession, message: str) -> None:
        """Keep a message for the session's next page (served by any replica)."""
        session.flash.append(message)
        with self.store.transaction() as s:
            rows.set_flash(s, session.id, session.flash)

    def take_flash(self, session: WebSession) -> list[str]:
        """The session's waiting messages, which are then gone."""
        taken, session.flash = session.flash, []
        if taken:
            with self.store.transaction() as s:
                rows.set_flash(s, session.id, [])
        return taken

    def _purge(self, now: float) -> None:
        # Anonymous sessions are made by every visit to the login page: without a purge the
        # table would grow with every visitor. Once a minute per process is plenty.
        with self._purge_guard:
            if self._purged_at is not None and now - self._purged_at < PURGE_EVERY:
                return
            self._purged_at = now
        with self.store.transaction() as s:
            rows.purge(
                s,
                idle_before=now - self.idle_seconds,
                created_before=now - self.absolute_seconds,
            )
