"""Waiting for a step that a worker host computes: PostgreSQL's LISTEN on `safeaccess_settled`.

An API replica with `execution = "queue"` answers a reveal once the step's job has settled it,
which happens in another process, usually on another host. One connection per replica listens;
each waiting request registers the step it waits for and is woken by the settle's NOTIFY. A
notification can be lost (the listening connection drops, PostgreSQL restarts), so a waiter also
looks at the step's row at least once a second: the NOTIFY makes it fast, the row makes it right.

The listener remembers the steps announced in the last `RECENT_SECONDS`, so a request that has
just queued its step need not read the row before it waits: a settle announced before it
registered is found there, one announced after wakes it.

An announcement usually carries what the settle wrote for the step's view (`queue.announcement`):
the waiter then answers from it, with no read at all. The listener keeps the last `VIEWS_MAX`
of those (each under PostgreSQL's 8000-byte limit: at most about 2 MB); an announcement without
them (a large output), or one pushed out since, sends the waiter to the row as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import psycopg
from sqlalchemy.engine import make_url

from safeaccess.server.store.queue import SETTLED_CHANNEL, parse_announcement

log = logging.getLogger("safeaccess.server.settled")

#: The longest a waiter goes without looking at the step's row.
RECHECK_SECONDS = 1.0
#: How long an announced step is remembered (longer than a replica takes from queuing a step's
#: job to waiting for it), and at most how many.
RECENT_SECONDS = 30.0
RECENT_MAX = 10_000
#: How many announced views are kept (see the module's docstring), for as long as above.
VIEWS_MAX = 256


def conninfo(url: str) -> str:
    """A libpq connection string from the store's SQLAlchemy URL (postgresql+psycopg://...)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class SettledListener:
    """Wakes the requests waiting for steps when their settles are announced."""

    def __init__(self, url: str):
        self._conninfo = conninfo(url)
        self._lock = threading.Lock()
        self._waiting: dict[str, set[threading.Event]] = {}
        self._recent: OrderedDict[str, float] = OrderedDict()
        self._views: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._stop = threading.Event()
        #: Set while the LISTEN is in place (announcements are being received).
        self.listening = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="settled-listener", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * RECHECK_SECONDS)

    def wait(
        self,
        sequence_id: str,
        index: int,
        timeout: float,
        done: Callable[[], bool],
        *,
        look_first: bool = True,
        announced: Callable[[str], bool] | None = None,
    ) -> bool:
        """Wait until `done()` (the step is no longer running) or `timeout`; whether it is.

        Without `look_first` (the caller queued the step's job just now, so it is running)
        `done()` is first called once the step is announced, or after `RECHECK_SECONDS`.
        With `announced`, each look first offers it the view's fields the step's announcement
        carried, if any: when it takes them (True), the step is settled and `done()` is not
        called."""
        key = f"{sequence_id}:{index}"
        event = threading.Event()
        with self._lock:
            self._waiting.setdefault(key, set()).add(event)
            # Under the lock `_wake` holds while it records an announcement: a settle is either
            # recent already or wakes this event.
            look = look_first or key in self._recent
        try:
            remaining = timeout
            while True:
                # Registered before the first look, so a settle between the two is not missed.
                if look and announced is not None:
                    fields = self._view(key)
                    if fields is not None and announced(fields):
                        return True
                if look and done():
                    return True
                look = True
                if remaining <= 0 or self._stop.is_set():
                    return False
                slice_ = min(remaining, RECHECK_SECONDS)
                event.wait(slice_)
                event.clear()
                remaining -= slice_
        finally:
            with self._lock:
                events = self._waiting.get(key)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del self._waiting[key]

    def _view(self, key: str) -> str | None:
        """The view's fields announced for `key` in the last `RECENT_SECONDS`, if kept."""
        with self._lock:
            kept = self._views.get(key)
        if kept is None or kept[0] < time.monotonic() - RECENT_SECONDS:
            return None
        return kept[1]

    def _wake(self, payload: str | None) -> None:
        """Wake the waiters of an announced step (`payload`), or every waiter (None)."""
        with self._lock:
            if payload is None:
                events = [e for group in self._waiting.values() for e in group]
            else:
                key, fields = parse_announcement(payload)
                events = list(self._waiting.get(key, ()))
                self._remember(key, fields)
        for event in events:
            event.set()

    def _remember(self, key: str, fields: str | None) -> None:
        now = time.monotonic()
        self._recent[key] = now
        self._recent.move_to_end(key)
        while self._recent and (
            len(self._recent) > RECENT_MAX
            or next(iter(self._recent.values())) < now - RECENT_SECONDS
        ):
            self._recent.popitem(last=False)
        if fields is None:
            # A later announcement without fields replaces any earlier one's: read the row.
            self._views.pop(key, None)
            return
        self._views[key] = (now, fields)
        self._views.move_to_end(key)
        while len(self._views) > VIEWS_MAX:
            self._views.popitem(last=False)

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as connection:
                    connection.execute(f"LISTEN {SETTLED_CHANNEL}")
                    self.listening.set()
                    self._wake(None)  # (re)connected: anything may have settled meanwhile
                    while not self._stop.is_set():
                        for note in connection.notifies(timeout=RECHECK_SECONDS):
                            self._wake(note.payload)
            except psycopg.Error as exc:
                self.listening.clear()
                log.warning("listening for settled steps failed (%s); reconnecting", exc)
                self._stop.wait(RECHECK_SECONDS)
