"""The bound and the hard guard of one admission's exact search (certificate.py).

The exact search behind the rank certificate is a branch-and-bound over atoms: deciding the span
criterion exactly is a minimum-weight cocircuit problem, NP-hard in general, so its work is
bounded, not its outcome predicted. Three limits, checked at every packing step:

- **operations**: multiply-adds of the column reductions the branching search's packings do (a
  column reduced against a basis of rank r in a quotient of dimension d costs d·r), counted
  from the first branch: the root packing, one greedy pass whose cost is polynomial
  (docs/qss.md), is what ordinary research needs and is never cut short by it. Deterministic:
  the same state and output always meet it at the same point, whatever the machine's load.
- **CPU seconds** (this thread's CPU clock): the guard for what the operation count does not
  foresee (Python overhead, a pathological basis). Both end the search with the refusal for
  cost (`TooCostly`), which never releases.
- **interruption**: `interrupt_all` (the server calls it when it stops) ends every search in the
  process with `Interrupted`, which is not a decision: the step stays re-runnable.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

#: Multiply-adds the branching search may spend on column reductions, over both primes (1 to
#: 3.5 s of one core: 0.6 to 2.2 ns an operation measured since the elimination is compiled,
#: the more the smaller the bases; docs/qss.md gives the figures).
SEARCH_OPERATIONS = 15 * 10**8
#: The decision's hard CPU guard (this thread's clock, from the start of the decision): issue
#: 41's bound of 10 s of CPU per admission, held by construction. Since the elimination is
#: compiled, the slowest ordinary admission of the corpora (with missing values too) takes
#: 2.3 s and the operation count ends a branching search within 1 to 3.5 s (docs/qss.md):
#: the guard is for what nobody foresaw.
SEARCH_CPU_SECONDS = 10.0

_interrupted = threading.Event()


class Interrupted(Exception):
    """The process is stopping: the admission was abandoned, nothing was decided."""


class Exhausted(Exception):
    """The search spent its operations or its CPU time: refused for cost."""

    def __init__(self, limit: str):
        super().__init__(limit)
        self.limit = limit


def interrupt_all() -> None:
    """End every admission's search in this process (at shutdown) with `Interrupted`."""
    _interrupted.set()


def interrupted() -> bool:
    return _interrupted.is_set()


def resume_all() -> None:
    """Allow searches again (a service started again in the same process, as tests do)."""
    _interrupted.clear()


@dataclass
class Budget:
    """What one admission's exact search may still spend."""

    operations: int = SEARCH_OPERATIONS
    cpu_seconds: float = SEARCH_CPU_SECONDS
    used: int = 0
    started: float = field(default_factory=time.thread_time)
    searching: bool = False  # operations count from the search's first branch

    def check(self) -> None:
        """Raise `Interrupted` when the process stops, `Exhausted` past a limit."""
        if _interrupted.is_set():
            raise Interrupted
        if self.searching and self.used > self.operations:
            raise Exhausted("operations")
        if time.thread_time() - self.started > self.cpu_seconds:
            raise Exhausted("cpu")

    def charge(self, columns: int, dim: int, rank: int) -> None:
        """Count the reduction of `columns` columns of dimension `dim` against a basis of
        `rank` vectors (and an elimination of the same order), then check the limits."""
        if self.searching:
            self.used += columns * dim * max(1, rank)
        self.check()
