"""The SQL of the review workspace's sessions (`web_sessions`), for `web.sessions.SessionStore`.

Every function works inside the caller's transaction. Rows are keyed by the SHA-256 of the
cookie (`cookie_digest`): the cookie's value is never written, so a copy of the database holds
no usable session.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import delete, or_, update
from sqlalchemy.orm import Session

from safeaccess.server.store.schema import WebSessionRow


def cookie_digest(cookie: str) -> str:
    """The row id of a session cookie: SHA-256 of its value, in hex."""
    return hashlib.sha256(cookie.encode("utf-8")).hexdigest()


def add(s: Session, cookie: str, *, csrf: str, checker: str | None, now: float) -> WebSessionRow:
    """A new session row for this cookie value."""
    row = WebSessionRow(
        id=cookie_digest(cookie), checker=checker, csrf=csrf, flash=[], created_at=now, seen_at=now
    )
    s.add(row)
    return row


def touch_live(
    s: Session, cookie: str, *, now: float, idle_before: float, created_before: float
) -> WebSessionRow | None:
    """Mark the cookie's session as seen `now` if it is still live (seen at or after
    `idle_before`, begun at or after `created_before`) and return it; None if it is not.

    The write comes first, so the transaction never upgrades a read to a write (which SQLite
    refuses when another writer committed in between)."""
    digest = cookie_digest(cookie)
    result = s.execute(
        update(WebSessionRow)
        .where(
            WebSessionRow.id == digest,
            WebSessionRow.seen_at >= idle_before,
            WebSessionRow.created_at >= created_before,
        )
        .values(seen_at=now)
    )
    if not getattr(result, "rowcount", 0):
        return None
    return s.get(WebSessionRow, digest, populate_existing=True)


def take(s: Session, cookie: str) -> tuple[str | None] | None:
    """Delete the cookie's session row; (its checker,) if there was one, else None."""
    result = s.execute(
        delete(WebSessionRow)
        .where(WebSessionRow.id == cookie_digest(cookie))
        .returning(WebSessionRow.checker)
    )
    row = result.first()
    return None if row is None else (row[0],)


def set_flash(s: Session, cookie: str, flash: list[str]) -> None:
    """Replace the messages waiting for the session's next page."""
    s.execute(
        update(WebSessionRow).where(WebSessionRow.id == cookie_digest(cookie)).values(flash=flash)
    )


def remove(s: Session, cookie: str) -> None:
    s.execute(delete(WebSessionRow).where(WebSessionRow.id == cookie_digest(cookie)))


def end_checker(s: Session, checker: str) -> int:
    """Delete every session of a checker (her account is disabled or removed); how many."""
    result = s.execute(delete(WebSessionRow).where(WebSessionRow.checker == checker))
    return int(getattr(result, "rowcount", 0) or 0)


def purge(s: Session, *, idle_before: float, created_before: float) -> int:
    """Delete the sessions idle since before `idle_before` or begun before `created_before`."""
    result = s.execute(
        delete(WebSessionRow).where(
            or_(WebSessionRow.seen_at < idle_before, WebSessionRow.created_at < created_before)
        )
    )
    return int(getattr(result, "rowcount", 0) or 0)
