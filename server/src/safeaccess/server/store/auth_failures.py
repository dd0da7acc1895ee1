"""The SQL of the authentication-failure limiters (`auth_failures`), shared by every replica.

A limiter is a name (`limiter`) and a window; a subject is what it limits (a key id, an address,
an account name), stored as the SHA-256 of the limiter's name and the subject so that the table
records no names or addresses and no subject is longer than 64 characters. Every function works
inside the caller's transaction.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import Connection, bindparam, delete, select
from sqlalchemy.orm import Session

from safeaccess.server.store.schema import AuthFailureRow


def subject_digest(limiter: str, subject: str) -> str:
    """The stored form of a subject: SHA-256 of the limiter's name and the subject, in hex."""
    return hashlib.sha256(f"{limiter}\x00{subject}".encode()).hexdigest()


def recent(
    s: Session | Connection, limiter: str, subject: str, *, since: float, most: int
) -> list[float]:
    """The times of the subject's failures after `since`, newest first, at most `most`."""
    params = {
        "limiter": limiter,
        "subject": subject_digest(limiter, subject),
        "since": since,
        "most": most,
    }
    return [float(at) for at in s.execute(_RECENT, params).scalars()]


# Built once: checked before every signed request.
_RECENT = (
    select(AuthFailureRow.at)
    .where(
        AuthFailureRow.limiter == bindparam("limiter"),
        AuthFailureRow.subject == bindparam("subject"),
        AuthFailureRow.at > bindparam("since"),
    )
    .order_by(AuthFailureRow.at.desc())
    .limit(bindparam("most"))
)


def add(s: Session, limiter: str, subject: str, at: float) -> None:
    """Count one failure of the subject at time `at`."""
    s.add(AuthFailureRow(limiter=limiter, subject=subject_digest(limiter, subject), at=at))


def clear(s: Session, limiter: str, subject: str) -> None:
    """Forget the subject's failures (a success)."""
    s.execute(
        delete(AuthFailureRow).where(
            AuthFailureRow.limiter == limiter,
            AuthFailureRow.subject == subject_digest(limiter, subject),
        )
    )


def purge(s: Session, limiter: str, *, before: float) -> int:
    """Delete the limiter's failures at or before `before` (out of its window); how many."""
    result = s.execute(
        delete(AuthFailureRow).where(AuthFailureRow.limiter == limiter, AuthFailureRow.at <= before)
    )
    return int(getattr(result, "rowcount", 0) or 0)
