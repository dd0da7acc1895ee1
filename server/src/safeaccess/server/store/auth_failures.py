"""The SQL of the authentication-failure limiters (`auth_failures`), shared by every replica,
and the read a signed request starts with: its key id's and address's limits with the key
registered under the name it claims (`nth_newest_and_key`).

A limiter is a name (`limiter`) and a window; a subject is what it limits (a key id, an address,
an account name), stored as the SHA-256 of the limiter's name and the subject so that the table
records no names or addresses and no subject is longer than 64 characters. Every function works
inside the caller's transaction.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import Connection, bindparam, delete, select
from sqlalchemy.orm import Session

from safeaccess.server.store.schema import AuditorRow, AuthFailureRow, ResearcherRow


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


def nth_newest(
    s: Session | Connection, checks: list[tuple[str, str, float, int]]
) -> list[float | None]:
    """For each (limiter, subject, since, n): the time of the subject's n-th newest failure
    after `since` (None: fewer than n), all in one statement."""
    if len(checks) == 2:
        first, second = s.execute(_NTH_PAIR, _pair_params(checks)).one()
        return [_seconds(first), _seconds(second)]
    return [
        _seconds(s.execute(_NTH, _nth_params(limiter, subject, since, n)).scalar())
        for limiter, subject, since, n in checks
    ]


def _pair_params(checks: list[tuple[str, str, float, int]]) -> dict[str, object]:
    """The bound parameters of `_NTH_PAIR` (and `_NTH_PAIR_KEY`) for two checks."""
    return {**_nth_params(*checks[0]), **_nth_params(*checks[1], suffix="2")}


def _seconds(at: object) -> float | None:
    return None if at is None else float(at)  # type: ignore[arg-type]


def _nth_params(
    limiter: str, subject: str, since: float, n: int, suffix: str = "1"
) -> dict[str, object]:
    return {
        f"l{suffix}": limiter,
        f"s{suffix}": subject_digest(limiter, subject),
        f"since{suffix}": since,
        f"skip{suffix}": n - 1,
    }


def _nth(suffix: str) -> Any:
    return (
        select(AuthFailureRow.at)
        .where(
            AuthFailureRow.limiter == bindparam(f"l{suffix}"),
            AuthFailureRow.subject == bindparam(f"s{suffix}"),
            AuthFailureRow.at > bindparam(f"since{suffix}"),
        )
        .order_by(AuthFailureRow.at.desc())
        .limit(1)
        .offset(bindparam(f"skip{suffix}"))
    )


# Built once: checked before every signed request, for its key id and its address at once.
_NTH = _nth("1")
_NTH_PAIR = select(_nth("1").scalar_subquery(), _nth("2").scalar_subquery())


def _with_key(row: type[ResearcherRow] | type[AuditorRow]) -> Any:
    """`_NTH_PAIR` and, in the same statement, the public key and fingerprint registered
    under the name `key_name` in `row`'s table (NULL, NULL: none)."""
    named = row.name == bindparam("key_name")
    return select(
        _nth("1").scalar_subquery(),
        _nth("2").scalar_subquery(),
        select(row.public_key).where(named).scalar_subquery(),
        select(row.fingerprint).where(named).scalar_subquery(),
    )


_NTH_PAIR_KEY = {"researcher": _with_key(ResearcherRow), "auditor": _with_key(AuditorRow)}


def nth_newest_and_key(
    s: Session | Connection,
    checks: list[tuple[str, str, float, int]],
    role: str,
    name: str,
) -> tuple[list[float | None], tuple[str, str] | None]:
    """`nth_newest` of two checks (a key id's and an address's) and the (public key,
    fingerprint) registered for `name` in `role`'s table (None: none), in one statement: a
    signed request needs both before its signature is checked."""
    params = {**_pair_params(checks), "key_name": name}
    first, second, public_key, fingerprint = s.execute(_NTH_PAIR_KEY[role], params).one()
    key = None if public_key is None else (str(public_key), str(fingerprint))
    return [_seconds(first), _seconds(second)], key


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
