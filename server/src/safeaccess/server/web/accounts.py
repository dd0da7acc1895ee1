"""Output checkers' accounts: enrolment by a one-time link, argon2id passwords, TOTP codes.

The enrolment token is random and only its SHA-256 is stored; it expires and is consumed by the
enrolment that uses it. A TOTP code is accepted once: the time step of the last accepted code is
kept, and a code of that step or an earlier one is refused (no replay inside its window).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyotp
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from safeaccess.server.errors import Conflict, InvalidRequest, NotFound
from safeaccess.server.store import Store, accounts, auditlog, web_sessions
from safeaccess.server.store.schema import CheckerRow

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.@-]{1,128}$")
ENROL_DAYS = 3
MIN_PASSWORD = 12
ISSUER = "safeaccess review"
_HASHER = PasswordHasher()  # argon2id with the library's RFC 9106 low-memory defaults
# Verified when the name is unknown, so a login takes as long whether or not the account exists.
_DUMMY_HASH = _HASHER.hash(secrets.token_hex(16))


@dataclass(frozen=True)
class Checker:
    name: str
    researcher: str | None
    state: str
    created_at: datetime


@dataclass(frozen=True)
class Enrolment:
    name: str
    token: str
    expires_at: datetime


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _view(row: CheckerRow) -> Checker:
    return Checker(row.name, row.researcher, row.state, row.created_at)


def add_checker(
    store: Store, name: str, *, researcher: str | None = None, actor: str = "admin"
) -> Enrolment:
    """A pending checker account and its one-time enrolment token (shown once, never stored)."""
    if not NAME_PATTERN.match(name):
        raise InvalidRequest(
            f"checker name {name!r}: use up to 128 letters, digits and _ . @ - (no spaces)"
        )
    if researcher is not None and store.get_researcher(researcher) is None:
        raise NotFound(f"researcher {researcher} does not exist")
    token = secrets.token_urlsafe(32)
    expires = datetime.now(UTC) + timedelta(days=ENROL_DAYS)
    with store.transaction() as s:
        if accounts.checker(s, name) is not None:
            raise Conflict(f"checker {name} already exists")
        accounts.add_checker(
            s,
            name,
            researcher=researcher,
            totp_secret=pyotp.random_base32(),
            token_sha256=_token_hash(token),
            expires_at=expires,
        )
        auditlog.append(s, "checker_added", actor, {"checker": name, "researcher": researcher})
    return Enrolment(name=name, token=token, expires_at=expires)


def list_checkers(store: Store) -> list[Checker]:
    with store.transaction() as s:
        return [_view(r) for r in accounts.checkers(s)]


def get_checker(store: Store, name: str) -> Checker | None:
    with store.transaction() as s:
        row = accounts.checker(s, name)
        return _view(row) if row is not None else None


def disable_checker(store: Store, name: str, *, actor: str = "admin") -> None:
    """Disable a checker's account and end her sessions (on every replica)."""
    with store.transaction() as s:
        row = accounts.checker(s, name)
        if row is None:
            raise NotFound(f"checker {name} does not exist")
        accounts.disable_checker(row)
        # Logged out everywhere at once: every replica reads sessions from this table.
        web_sessions.end_checker(s, name)
        auditlog.append(s, "checker_disabled", actor, {"checker": name})


def _aware(at: datetime) -> datetime:
    # SQLite gives naive datetimes back; they were written in UTC.
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def enrolment_for(store: Store, token: str) -> tuple[str, str] | None:
    """(checker name, TOTP secret) of a valid, unused, unexpired enrolment token; else None."""
    digest = _token_hash(token)
    with store.transaction() as s:
        row = accounts.checker_by_token(s, digest)
        if row is None or row.state != "pending" or row.enrol_expires_at is None:
            return None
        if _aware(row.enrol_expires_at) < datetime.now(UTC):
            return None
        return row.name, row.totp_secret


def provisioning_uri(name: str, secret: str) -> str:
    return pyotp.TOTP(secret).provisioning_uri(name=name, issuer_name=ISSUER)


def _accept_code(row: CheckerRow, code: str, now: datetime) -> bool:
    """Accept a 6-digit code of this or the neighbouring time step, once."""
    code = code.strip().replace(" ", "")
    if not re.fullmatch(r"\d{6}", code):
        return False
    totp = pyotp.TOTP(row.totp_secret)
    current = totp.timecode(now)
    for step in (current, current - 1, current + 1):
        if step <= row.last_totp_step:
            continue
        if hmac.compare_digest(totp.generate_otp(step), code):
            accounts.accept_totp_step(row, step)
            return True
    return False


def enrol(store: Store, token: str, password: str, confirm: str, code: str) -> str:
    """Set the password and confirm the TOTP factor with a valid code; the account is active and
    the token spent. Returns the checker's name; InvalidRequest says what to fix."""
    if password != confirm:
        raise InvalidRequest("the two passwords differ; type the same password twice")
    if len(password) < MIN_PASSWORD:
        raise InvalidRequest(f"choose a password of at least {MIN_PASSWORD} characters")
    digest = _token_hash(token)
    with store.transaction() as s:
        row = accounts.checker_by_token(s, digest, lock=True)
        if (
            row is None
            or row.state != "pending"
            or row.enrol_expires_at is None
            or _aware(row.enrol_expires_at) < datetime.now(UTC)
        ):
            raise InvalidRequest(
                "this enrolment link is not valid (used, expired or mistyped); ask the "
                "administrator for a new one"
            )
        if not _accept_code(row, code, datetime.now(UTC)):
            raise InvalidRequest(
                "the code from your authenticator app is not right; add the secret shown "
                "and type the current 6-digit code"
            )
        accounts.activate_checker(row, _HASHER.hash(password))
        auditlog.append(s, "checker_enrolled", row.name, {"checker": row.name})
        return row.name


def authenticate(store: Store, name: str, password: str, code: str) -> str | None:
    """The checker's name if the password and a fresh TOTP code are right and the account is
    active; None otherwise (which one failed is not told)."""
    with store.transaction() as s:
        row = accounts.checker(s, name, lock=True)
        if row is None or row.state != "active" or row.password_hash is None:
            with contextlib.suppress(VerificationError, InvalidHashError):
                _HASHER.verify(_DUMMY_HASH, password)
            return None
        try:
            _HASHER.verify(row.password_hash, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return None
        if not _accept_code(row, code, datetime.now(UTC)):
            return None
        return row.name


def is_active(store: Store, name: str) -> bool:
    checker = get_checker(store, name)
    return checker is not None and checker.state == "active"
