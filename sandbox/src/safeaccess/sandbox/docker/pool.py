"""A warm pool of started job containers, per dataset, refilled in the background.

A job container must have its dataset bind-mounted when it is created, so warm containers are
kept per *pool key*: the dataset file's identity plus the job limits (limits are fixed at create
time too). The pool keeps `size` containers ready for each of the `max_keys` most recently used
keys; older keys are dropped and their containers removed. A container is handed out once and
never returns: after its one job the backend removes it, so nothing carries from one job to the
next.

Why not one pool for all datasets, passing the data in through stdin? Datasets can be gigabytes;
copying them through the attach stream for each job would cost more than the container start it
saves, and mounting a directory of datasets would let a job read datasets it was not given.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")

RETRY_SECONDS = 5.0


class WarmPool(Generic[K, C]):
    """Keeps started items (containers) per key; `start` makes one, `stop` disposes of one."""

    def __init__(
        self,
        *,
        start: Callable[[K], C],
        stop: Callable[[C], None],
        alive: Callable[[C], bool],
        size: int,
        max_keys: int,
    ):
        if size < 1 or max_keys < 1:
            raise ValueError("a warm pool needs size >= 1 and max_keys >= 1")
        self._start = start
        self._stop = stop
        self._alive = alive
        self.size = size
        self.max_keys = max_keys
        self._ready: OrderedDict[K, deque[C]] = OrderedDict()
        self._starting: dict[K, int] = {}
        self._failed_until: dict[K, float] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None

    def want(self, key: K, *, refill: bool = True) -> None:
        """Keep containers ready for `key` (most recently wanted); drop the least recent keys.

        With `refill=False` the key is only registered: the caller is about to run a job and a
        container starting now would compete with it for CPU; it calls `want` again afterwards.
        """
        evicted: list[C] = []
        with self._cond:
            if self._closed:
                return
            self._ready.setdefault(key, deque())
            self._ready.move_to_end(key)
            while len(self._ready) > self.max_keys:
                _, items = self._ready.popitem(last=False)
                evicted.extend(items)
            if refill:
                self._ensure_thread()
                self._cond.notify_all()
        for item in evicted:
            self._stop(item)

    def take(self, key: K) -> C | None:
        """A ready container for `key`, or None (the caller then starts one itself).

        Does not trigger a refill: call `want(key)` once the job is done.
        """
        self.want(key, refill=False)
        while True:
            with self._cond:
                items = self._ready.get(key)
                item = items.popleft() if items else None
            if item is None:
                return None
            if self._alive(item):
                return item
            self._stop(item)  # died while waiting (engine restart, killed): try the next one

    def ready_count(self, key: K) -> int:
        with self._cond:
            return len(self._ready.get(key, ()))

    def wait_ready(self, key: K, count: int, timeout: float) -> bool:
        """Block until `count` containers are ready for `key` (for benchmarks and tests)."""
        end = time.monotonic() + timeout
        with self._cond:
            while len(self._ready.get(key, ())) < count:
                remaining = end - time.monotonic()
                if remaining <= 0 or self._closed:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self) -> None:
        """Stop refilling and dispose of every ready container."""
        with self._cond:
            self._closed = True
            items = [item for queue in self._ready.values() for item in queue]
            self._ready.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=60)
        for item in items:
            self._stop(item)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._fill, name="sandbox-pool", daemon=True)
            self._thread.start()

    def _next_key(self) -> K | None:
        now = time.monotonic()
        # Most recently used first: that dataset is the likeliest to be asked for again.
        for key in reversed(self._ready):
            if self._failed_until.get(key, 0.0) > now:
                continue
            if len(self._ready[key]) + self._starting.get(key, 0) < self.size:
                return key
        return None

    def _fill(self) -> None:
        while True:
            with self._cond:
                key = self._next_key()
                while key is None and not self._closed:
                    retry = [t for t in self._failed_until.values() if t > time.monotonic()]
                    wait = min(retry) - time.monotonic() if retry else None
                    self._cond.wait(wait)
                    key = self._next_key()
                if self._closed or key is None:
                    return
                self._starting[key] = self._starting.get(key, 0) + 1
            item: C | None = None
            try:
                item = self._start(key)
            except Exception as exc:  # keep serving cold; say why the pool is not filling
                self.last_error = str(exc)
                log.warning("sandbox warm pool could not start a container: %s", exc)
                with self._cond:
                    self._failed_until[key] = time.monotonic() + RETRY_SECONDS
            finally:
                keep = False
                with self._cond:
                    self._starting[key] -= 1
                    if item is not None and not self._closed and key in self._ready:
                        self._ready[key].append(item)
                        self._failed_until.pop(key, None)
                        keep = True
                    self._cond.notify_all()
                if item is not None and not keep:
                    self._stop(item)
