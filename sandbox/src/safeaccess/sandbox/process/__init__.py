"""The process backend: jobs in bubblewrap sandboxes, forked from per-dataset templates.

`ProcessBackend` (in `backend.py`) is the host side; `bwrap.py` builds the bubblewrap command,
`forkserver.py` keeps the templates, and `template.py`, `isolate.py` and
`template_privileges.py` run inside the sandbox.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from safeaccess.sandbox.process.backend import ProcessBackend

__all__ = ["ProcessBackend"]


def __getattr__(name: str) -> Any:
    # Lazy (PEP 562): `python -m safeaccess.sandbox.process.template` imports this package
    # inside the sandbox, where nothing of the host side may be imported before the template
    # has left the host's privileges.
    if name == "ProcessBackend":
        from safeaccess.sandbox.process.backend import ProcessBackend

        return ProcessBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
