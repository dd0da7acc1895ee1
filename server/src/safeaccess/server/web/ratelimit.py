"""Login rate limiting: failed attempts per account and per client address in a sliding window.

Only failures count; a success clears the account's failures. Past the limit, attempts are refused
without checking the password, with the seconds to wait. The failures are rows of the store's
`auth_failures` table, so every replica counts the same failures: a guesser gains nothing by
spreading attempts over replicas.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from safeaccess.server.store import Store
from safeaccess.server.store import auth_failures as rows


class FailureLimiter:
    """At most `limit` failures of one key in any `window_seconds`; `name` keeps the rows of
    different limiters apart in the shared table."""

    def __init__(
        self,
        store: Store,
        name: str,
        limit: int,
        window_seconds: float,
        clock: Callable[[], float] = time.time,
    ):
        self.store = store
        self.name = name
        self.limit = limit
        self.window = window_seconds
        self._clock = clock

    def retry_after(self, key: str) -> int:
        """Seconds until `key` may try again (0: it may now)."""
        now = self._clock()
        with self.store.transaction() as s:
            times = rows.recent(s, self.name, key, since=now - self.window, most=self.limit)
        if len(times) < self.limit:
            return 0
        # Free again when the oldest of the last `limit` failures leaves the window.
        return max(1, math.ceil(self.window - (now - times[-1])))

    def fail(self, key: str) -> None:
        now = self._clock()
        with self.store.transaction() as s:
            # Failures under ever new names must not grow the table without bound: whatever
            # has left the window goes with each new failure.
            rows.purge(s, self.name, before=now - self.window)
            rows.add(s, self.name, key, now)

    def clear(self, key: str) -> None:
        with self.store.transaction() as s:
            rows.clear(s, self.name, key)
