"""A step's output commitment, computed once when its outcome is logged and reused by its
receipt.

The outcome record and the receipt commit to the same output with the same salt: both need
SHA-256(salt || canonical JSON of the output), and the canonical JSON of a table is most of the
work. `commitment` remembers the last few it computed, by salt (drawn fresh for every step), for
the very output object it was given: the receipt built from the settled step's row finds it,
and any other object (a row read back from the database) is committed to afresh.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from safeaccess.client.audit.records import commit

#: Enough for every step settling at once on one server; older entries are computed again.
_LIMIT = 256
_recent: OrderedDict[bytes, tuple[Any, str]] = OrderedDict()
_lock = threading.Lock()


def commitment(salt: bytes, output: Any) -> str:
    """`commit(salt, output)` (hex), computed once per salt and output object."""
    with _lock:
        known = _recent.get(salt)
    # The object itself, not an equal one: a stored output read back is a new object.
    if known is not None and known[0] is output:
        return known[1]
    value = commit(salt, output)
    with _lock:
        _recent[salt] = (output, value)
        while len(_recent) > _LIMIT:
            _recent.popitem(last=False)
    return value
