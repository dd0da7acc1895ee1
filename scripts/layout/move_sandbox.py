#!/usr/bin/env python3
"""Move the sandbox distribution to its sub-package layout and rewrite every reference to it.

The layout (see docs/sandbox.md): `process/` (the bubblewrap backend and its fork server),
`docker/` (+ `entry.py`), `runner/` (what runs inside a sandbox: the runner, its filters,
design matrices, columns and compute modules) and `mock/` (rehearsal on a mock dataset, which
runs outside any sandbox). The contract modules (`backend`, `config`, `factory`, `supervise`,
`seccomp`) stay at the root.

What it does, in order:

1. `git mv` each module in `MOVES` to its new path (skipped where that is already done);
2. writes the few new files the packages need (`process/__init__.py`, `runner/__main__.py`,
   `mock/__init__.py`) where they are missing, and moves the runner's `__main__` block into
   `runner/__main__.py`;
3. rewrites, in every file git tracks (or would track) under `REWRITE_ROOTS`, the dotted module
   names (`safeaccess.sandbox.forkserver` -> `safeaccess.sandbox.process.forkserver`: imports,
   `-m` arguments, the module-name strings the backends start, monkeypatch targets, prose) and
   the file paths (`sandbox/compute/tables.py` -> `sandbox/runner/compute/tables.py`), and
   turns `from safeaccess.sandbox import forkserver` into
   `from safeaccess.sandbox.process import forkserver`.

The engine (the `git mv`s, the rewrites, `--check`, idempotence) is `moves.py`, shared with
`move_server.py`; this file holds the sandbox's mapping and new files only.

Idempotent: on a tree already moved nothing matches any more (every pattern names an old path
that no new path contains), so it changes nothing; run it again after merging a branch written
against the old layout and it rewrites that branch's files. No shims are left at the old paths.

Usage: `python scripts/layout/move_sandbox.py [--check]` from anywhere in the repository;
`--check` lists the files it would change and exits 1 if there are any.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moves import Layout, run  # the engine, beside this script

#: Old module (dotted, below safeaccess.sandbox) -> new module. A package keeps its dotted name
#: for its children (compute.tables -> runner.compute.tables).
MODULES: dict[str, str] = {
    "process": "process.backend",
    "forkserver": "process.forkserver",
    "template": "process.template",
    "template_privileges": "process.template_privileges",
    "isolate": "process.isolate",
    "docker_entry": "docker.entry",
    "filters": "runner.filters",
    "design": "runner.design",
    "columns": "runner.columns",
    "compute": "runner.compute",
    "mock_data": "mock.data",
    "mock_rehearsal": "mock.rehearsal",
}

#: Names a new package exports itself (lazily): `safeaccess.sandbox.process.ProcessBackend` and
#: `from safeaccess.sandbox.process import ProcessBackend` are new-layout references, left alone.
#: Submodules of the new packages that the move did not create (process/bwrap.py, split out of
#: process/backend.py later) count as new too.
PACKAGE_EXPORTS: dict[str, tuple[str, ...]] = {"process": ("ProcessBackend", "bwrap")}

#: Old path -> new path, below sandbox/src/safeaccess/sandbox.
MOVES: dict[str, str] = {
    "process.py": "process/backend.py",
    "forkserver.py": "process/forkserver.py",
    "template.py": "process/template.py",
    "template_privileges.py": "process/template_privileges.py",
    "isolate.py": "process/isolate.py",
    "docker_entry.py": "docker/entry.py",
    "runner.py": "runner/__init__.py",
    "filters.py": "runner/filters.py",
    "design.py": "runner/design.py",
    "columns.py": "runner/columns.py",
    "compute": "runner/compute",
    "mock_data.py": "mock/data.py",
    "mock_rehearsal.py": "mock/rehearsal.py",
}

# process/__init__.py must not import the backend eagerly: the fork server's template runs as
# `python -m safeaccess.sandbox.process.template` inside the sandbox, and importing the package
# first must not pull host-side code (pydantic, the backend) in before it drops its privileges.
PROCESS_INIT = '''"""The process backend: jobs in bubblewrap sandboxes, forked from per-dataset templates.

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
'''

RUNNER_MAIN = '''"""`python -m safeaccess.sandbox.runner`: answer one request (see `safeaccess.sandbox.runner`)."""

import os

from safeaccess.sandbox.runner import main

if __name__ == "__main__":
    status = main()
    # The response is written and flushed; skip interpreter teardown (finalising pandas and
    # friends takes longer than many analyses) so the sandbox is gone as soon as possible.
    os._exit(status)
'''

MOCK_INIT = '''"""Rehearsal on a mock dataset drawn from published metadata alone.

It runs the runner's compute code outside any sandbox (there is nothing confidential in a mock),
so it lives beside the runner, not in it: `data.py` draws the mock, `rehearsal.py` runs a plan.
"""
'''

NEW_FILES = {
    "process/__init__.py": PROCESS_INIT,
    "runner/__main__.py": RUNNER_MAIN,
    "mock/__init__.py": MOCK_INIT,
}

#: Where references are rewritten (tracked and untracked-but-not-ignored files).
REWRITE_ROOTS = (
    "client/src",
    "rules/src",
    "sandbox/src",
    "server/src",
    "tests",
    "benchmarks",
    "docs",
    "scripts",
    "deploy",
    "README.md",
    "ARCHITECTURE.md",
)
_MAIN_BLOCK = re.compile(r'\n\nif __name__ == "__main__":\n(?:    .*\n|\n)*\Z')


def _strip_runner_main(root: Path, package: Path, check: bool) -> list[str]:
    """The runner's `__main__` block moved to `runner/__main__.py`: drop it from the package."""
    runner = package / "runner/__init__.py"
    if not runner.exists():
        return []
    text = runner.read_text(encoding="utf-8")
    stripped = _MAIN_BLOCK.sub("\n", text)
    if stripped == text:
        return []
    if not check:
        runner.write_text(stripped, encoding="utf-8")
    return [f"{LAYOUT.package}/runner/__init__.py (__main__ block -> runner/__main__.py)"]


LAYOUT = Layout(
    dist="sandbox",
    modules=MODULES,
    moves=MOVES,
    rewrite_roots=REWRITE_ROOTS,
    package_exports=PACKAGE_EXPORTS,
    new_files=NEW_FILES,
    fixup=_strip_runner_main,
)


if __name__ == "__main__":
    raise SystemExit(run(LAYOUT, (__doc__ or "").splitlines()[0]))
