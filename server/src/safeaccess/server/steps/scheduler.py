"""A fair job queue: a fixed number of slots shared across researchers, at most `per_owner`
running for any one researcher, and free slots handed out round-robin over the researchers who
are waiting (in arrival order within each researcher).

It replaces a plain semaphore, under which four sleeping scripts of one researcher filled every
slot and another researcher's one-second table waited 95 s. With this queue a waiting researcher
gets the next slot that frees (one slot turnover), however many jobs another one has queued.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager


class FairScheduler:
    """Slots for jobs, fair across owners (researchers)."""

    def __init__(self, slots: int, per_owner: int):
        if slots < 1 or per_owner < 1:
            raise ValueError("a scheduler needs at least one slot and one job per owner")
        self.slots = slots
        self.per_owner = per_owner
        self._cond = threading.Condition()
        self._running: dict[str, int] = {}
        # Owners with waiting jobs, in the order they get their next turn; each with its tickets.
        self._waiting: OrderedDict[str, deque[int]] = OrderedDict()
        self._granted: set[int] = set()
        self._tickets = itertools.count()

    @property
    def running(self) -> int:
        with self._cond:
            return sum(self._running.values())

    def _dispatch(self) -> None:
        """Grant free slots, round-robin over owners below their quota. Caller holds the lock."""
        free = self.slots - sum(self._running.values())
        while free > 0:
            # The owner with the fewest jobs running goes first (ties: whoever waited longest for
            # a turn), so a newcomer is served before anyone who already holds a slot.
            eligible = [
                (self._running.get(o, 0), position, o)
                for position, o in enumerate(self._waiting)
                if self._running.get(o, 0) < self.per_owner
            ]
            if not eligible:
                return
            owner = min(eligible)[2]
            tickets = self._waiting.pop(owner)
            self._granted.add(tickets.popleft())
            self._running[owner] = self._running.get(owner, 0) + 1
            if tickets:
                self._waiting[owner] = tickets  # back of the line: the others go first
            free -= 1
        self._cond.notify_all()

    @contextmanager
    def slot(self, owner: str) -> Iterator[None]:
        """Hold one slot for `owner` while the block runs (waits for its turn)."""
        with self._cond:
            ticket = next(self._tickets)
            self._waiting.setdefault(owner, deque()).append(ticket)
            self._dispatch()
            try:
                while ticket not in self._granted:
                    self._cond.wait()
            except BaseException:
                self._abandon(owner, ticket)
                raise
            self._granted.discard(ticket)
        try:
            yield
        finally:
            with self._cond:
                self._running[owner] -= 1
                if not self._running[owner]:
                    del self._running[owner]
                self._dispatch()
                self._cond.notify_all()

    def _abandon(self, owner: str, ticket: int) -> None:
        if ticket in self._granted:
            self._granted.discard(ticket)
            self._running[owner] -= 1
            if not self._running[owner]:
                del self._running[owner]
        else:
            tickets = self._waiting.get(owner)
            if tickets is not None and ticket in tickets:
                tickets.remove(ticket)
                if not tickets:
                    del self._waiting[owner]
        self._dispatch()
