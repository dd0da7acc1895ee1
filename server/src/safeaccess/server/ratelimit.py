"""Rate limits on authentication failures: per claimed key id and per client address.

A signature cannot be guessed, so the limit is not what keeps a key safe; it keeps a client that
fails again and again (a misconfigured one, or someone probing names) from filling the log and
the CPU. Past its limit, a key id or an address is refused with 429 and a Retry-After, before any
signature is checked, until enough of its failures have left the window. The per-address limit
is the wider one: it also stops one address from locking several keys.

The limiter is an interface (`FailureLimiter`). The server uses `DatabaseFailureLimiter`, whose
failures are rows of the store's `auth_failures` table: every replica behind a load balancer
counts the same failures, so spreading them over replicas gains nothing.
`MemoryFailureLimiter` keeps them in this process (tests that inject their own limits).
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from safeaccess.server.errors import ServiceError
from safeaccess.server.store import auth_failures as rows
from safeaccess.server.store.database import Database

_KEYID = re.compile(r'keyid="([^"]{1,128})"')
MAX_SUBJECTS = 100_000  # subjects tracked at once; the least recently failed are forgotten


class TooManyFailures(ServiceError, status=429, code="too_many_failures"):
    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Limit:
    failures: int
    window_seconds: float


PER_KEY = Limit(failures=20, window_seconds=300.0)
PER_ADDRESS = Limit(failures=50, window_seconds=300.0)


class FailureLimiter(Protocol):
    def retry_after(self, key: str | None, address: str | None) -> float | None:
        """Seconds until the key id or the address may try again; None if both may now."""

    def failed(self, key: str | None, address: str | None) -> None:
        """Count one authentication failure against both."""


def claimed_keyid(headers: Mapping[str, str]) -> str | None:
    """The key id a request claims (before its signature is checked), if it names one."""
    raw = headers.get("signature-input") or headers.get("Signature-Input")
    match = _KEYID.search(raw or "")
    return match.group(1) if match else None


class MemoryFailureLimiter:
    """Sliding windows of failure times, per subject, in this process."""

    def __init__(
        self,
        per_key: Limit = PER_KEY,
        per_address: Limit = PER_ADDRESS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._limits = {"key": per_key, "address": per_address}
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()

    def _subjects(self, key: str | None, address: str | None) -> Sequence[tuple[str, str]]:
        return [(kind, v) for kind, v in (("key", key), ("address", address)) if v is not None]

    def _recent(self, subject: tuple[str, str], now: float) -> deque[float]:
        times = self._failures.get(subject, deque())
        window = self._limits[subject[0]].window_seconds
        while times and times[0] <= now - window:
            times.popleft()
        return times

    def retry_after(self, key: str | None, address: str | None) -> float | None:
        now = self._clock()
        wait = 0.0
        with self._lock:
            for subject in self._subjects(key, address):
                limit = self._limits[subject[0]]
                times = self._recent(subject, now)
                if len(times) >= limit.failures:
                    # Free again when the oldest failure that keeps it at the limit leaves.
                    oldest = times[len(times) - limit.failures]
                    wait = max(wait, oldest + limit.window_seconds - now)
        return wait if wait > 0 else None

    def failed(self, key: str | None, address: str | None) -> None:
        now = self._clock()
        with self._lock:
            for subject in self._subjects(key, address):
                times = self._recent(subject, now)
                times.append(now)
                self._failures[subject] = times
                self._failures.move_to_end(subject)
            while len(self._failures) > MAX_SUBJECTS:
                self._failures.popitem(last=False)


class DatabaseFailureLimiter:
    """Sliding windows of failure times, per subject, in the database every replica shares.

    Times are seconds since the epoch (`clock`): replicas compare times each other wrote."""

    #: The `auth_failures.limiter` name of each kind of subject.
    NAMES: ClassVar[Mapping[str, str]] = {"key": "api-key", "address": "api-address"}

    def __init__(
        self,
        store: Database,
        per_key: Limit = PER_KEY,
        per_address: Limit = PER_ADDRESS,
        clock: Callable[[], float] = time.time,
    ):
        self.store = store
        self._limits = {"key": per_key, "address": per_address}
        self._clock = clock

    def _subjects(self, key: str | None, address: str | None) -> Sequence[tuple[str, str]]:
        return [(kind, v) for kind, v in (("key", key), ("address", address)) if v is not None]

    def retry_after(self, key: str | None, address: str | None) -> float | None:
        now = self._clock()
        subjects = self._subjects(key, address)
        if not subjects:
            return None
        with self.store.one_statement() as s:
            # The failure that keeps a subject at its limit: its n-th newest in the window.
            nths = rows.nth_newest(s, self._checks(subjects, now))
        return self._wait(subjects, nths, now)

    def retry_after_and_key(
        self, key: str, address: str, role: str, name: str
    ) -> tuple[float | None, tuple[str, str] | None]:
        """`retry_after` of a key id and an address, and the (public key, fingerprint)
        registered for `name` in `role`'s table (None: none), read in one statement."""
        now = self._clock()
        subjects = self._subjects(key, address)
        with self.store.one_statement() as s:
            nths, registered = rows.nth_newest_and_key(s, self._checks(subjects, now), role, name)
        return self._wait(subjects, nths, now), registered

    def _checks(
        self, subjects: Sequence[tuple[str, str]], now: float
    ) -> list[tuple[str, str, float, int]]:
        return [
            (
                self.NAMES[kind],
                value,
                now - self._limits[kind].window_seconds,
                self._limits[kind].failures,
            )
            for kind, value in subjects
        ]

    def _wait(
        self, subjects: Sequence[tuple[str, str]], nths: Sequence[float | None], now: float
    ) -> float | None:
        wait = 0.0
        for (kind, _), at in zip(subjects, nths, strict=True):
            if at is not None:
                # Free again when the oldest failure that keeps it at the limit leaves.
                wait = max(wait, at + self._limits[kind].window_seconds - now)
        return wait if wait > 0 else None

    def failed(self, key: str | None, address: str | None) -> None:
        now = self._clock()
        with self.store.transaction() as s:
            for kind, value in self._subjects(key, address):
                name = self.NAMES[kind]
                # What has left the window goes with each new failure, so failures under ever
                # new key ids or addresses do not grow the table without bound.
                rows.purge(s, name, before=now - self._limits[kind].window_seconds)
                rows.add(s, name, value, now)
