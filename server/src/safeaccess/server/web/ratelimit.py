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
from dataclasses import dataclass

from safeaccess.server.store import Store
from safeaccess.server.store import auth_failures as rows


@dataclass(eq=False)
class FailureLimiter:
    """At most `limit` failures of one key in any `window_seconds`; `name` keeps the rows of
    different limiters apart in the shared table. `clock`: seconds since the epoch (replicas
    compare the times each other wrote)."""

    store: Store
    name: str
    limit: int
    window_seconds: float
    clock: Callable[[], float] = time.time

    def retry_after(self, key: str) -> int:
        """Seconds until `key` may try again (0: it may now)."""
        now = self.clock()
        with self.store.transaction() as s:
            times = rows.recent(s, self.name, key, since=now - self.window_seconds, most=self.limit)
        if len(times) < self.limit:
            return 0
        # Free again when the oldest of the last `limit` failures leaves the window.
        return max(1, math.ceil(self.window_seconds - (now - times[-1])))

    def fail(self, key: str) -> None:
        now = self.clock()
        with self.store.transaction() as s:
            # Failures under ever new names must not grow the table without bound: whatever
            # has left the window goes with each new failure.
            rows.purge(s, self.name, before=now - self.window_seconds)
            rows.add(s, self.name, key, now)

    def clear(self, key: str) -> None:
        with self.store.transaction() as s:
            rows.clear(s, self.name, key)
