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

Idempotent: on a tree already moved nothing matches any more (every pattern names an old path
that no new path contains), so it changes nothing; run it again after merging a branch written
against the old layout and it rewrites that branch's files. No shims are left at the old paths.

Usage: `python scripts/layout/move_sandbox.py [--check]` from anywhere in the repository;
`--check` lists the files it would change and exits 1 if there are any.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE = "sandbox/src/safeaccess/sandbox"

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

#: Old path -> new path, below PACKAGE.
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
TEXT_SUFFIXES = {
    ".py",
    ".pyi",
    ".md",
    ".rst",
    ".txt",
    ".toml",
    ".cfg",
    ".ini",
    ".yaml",
    ".yml",
    ".sh",
    ".html",
    ".j2",
    ".Dockerfile",
    "",
}
THIS_FILE = "scripts/layout/move_sandbox.py"

_MAIN_BLOCK = re.compile(r'\n\nif __name__ == "__main__":\n(?:    .*\n|\n)*\Z')


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout


def _dotted_patterns() -> list[tuple[re.Pattern[str], str]]:
    patterns = []
    for old, new in MODULES.items():
        guard = ""
        if new.startswith(old + "."):
            # `process` becomes a package: a name already below it (process.backend) is new.
            children = _new_package_names(old)
            alternatives = "|".join(sorted(children))
            # `from safeaccess.sandbox.process import ...` is decided by what it imports
            # (`_rewrite_from_new_package`).
            guard = r"(?!\.(?:" + alternatives + r")\b)(?!\s+import\b)"
        patterns.append(
            (
                re.compile(r"(?<![\w.])safeaccess\.sandbox\." + re.escape(old) + r"(?!\w)" + guard),
                "safeaccess.sandbox." + new,
            )
        )
    return patterns


def _path_patterns() -> list[tuple[re.Pattern[str], str]]:
    patterns = []
    for old, new in MOVES.items():
        tail = re.escape(old) + r"(?![\w])"
        # safeaccess/sandbox/<old> (an installed or source path), or sandbox/<old> on its own
        # (the short form the docs use; not tests/sandbox/<old>).
        patterns.append(
            (
                re.compile(r"(?<![\w.-])((?:sandbox/src/)?safeaccess/sandbox/)" + tail),
                r"\g<1>" + new,
            )
        )
        patterns.append((re.compile(r"(?<![\w./-])(sandbox/)" + tail), r"\g<1>" + new))
    return patterns


_FROM_PACKAGE = re.compile(
    r"^(?P<indent>[ \t]*)from safeaccess\.sandbox import (?P<names>[\w ,]+?)"
    r"(?P<comment>[ \t]*#.*)?$",
    re.MULTILINE,
)


def _rewrite_from_package(text: str) -> str:
    """`from safeaccess.sandbox import forkserver, seccomp` -> one import per moved module."""

    def repl(match: re.Match[str]) -> str:
        names = [n.strip() for n in match.group("names").split(",") if n.strip()]
        if not any(n.split(" as ")[0].strip() in MODULES for n in names):
            return match.group(0)
        indent, comment = match.group("indent"), match.group("comment") or ""
        kept, lines = [], []
        for name in names:
            module, _, alias = (part.strip() for part in name.partition(" as "))
            if module not in MODULES:
                kept.append(name)
                continue
            parent, _, leaf = ("safeaccess.sandbox." + MODULES[module]).rpartition(".")
            bound = alias or module
            line = f"{indent}from {parent} import {leaf}"
            lines.append(line + (f" as {bound}" if bound != leaf else "") + comment)
        if kept:
            lines.insert(0, f"{indent}from safeaccess.sandbox import {', '.join(kept)}{comment}")
        return "\n".join(lines)

    return _FROM_PACKAGE.sub(repl, text)


def _new_package_names(old: str) -> set[str]:
    """What the new package `old` (process) holds itself: its submodules and its exports."""
    children = {
        m.split(".", 1)[1].split(".")[0] for m in MODULES.values() if m.startswith(old + ".")
    }
    return children | set(PACKAGE_EXPORTS.get(old, ()))


def _rewrite_from_new_package(text: str) -> str:
    """`from safeaccess.sandbox.process import X, Y`: left alone when every name is one the new
    package holds (`ProcessBackend`, `forkserver` ...), else an old-layout import of the module
    that became `process/backend.py`, rewritten to import from there."""
    for old, new in MODULES.items():
        if not new.startswith(old + "."):
            continue
        held = _new_package_names(old)
        pattern = re.compile(
            r"(?<![\w.])from safeaccess\.sandbox\."
            + re.escape(old)
            + r"(\s+import\s+)(\([^)]*\)|[^\n]*)"
        )

        def repl(match: re.Match[str], held: set[str] = held, new: str = new) -> str:
            body = re.sub(r"#[^\n]*", "", match.group(2)).strip("() \n")
            names = {n.split(" as ")[0].strip() for n in body.split(",") if n.strip()}
            if names <= held:
                return match.group(0)
            return f"from safeaccess.sandbox.{new}{match.group(1)}{match.group(2)}"

        text = pattern.sub(repl, text)
    return text


def rewrite(text: str) -> str:
    """`text` with every reference to an old sandbox module or path replaced by the new one."""
    for pattern, new in _dotted_patterns():
        text = pattern.sub(new, text)
    text = _rewrite_from_new_package(text)
    # After the dotted names: the imports it writes name new modules only.
    text = _rewrite_from_package(text)
    for pattern, new in _path_patterns():
        text = pattern.sub(new, text)
    return text


def _move(root: Path, check: bool) -> list[str]:
    changed = []
    package = root / PACKAGE
    for old, new in MOVES.items():
        source, target = package / old, package / new
        if not source.exists():
            continue
        if target.exists():
            sys.exit(f"both {PACKAGE}/{old} and {PACKAGE}/{new} exist: merge them by hand first")
        changed.append(f"{PACKAGE}/{old} -> {PACKAGE}/{new}")
        if not check:
            target.parent.mkdir(parents=True, exist_ok=True)
            _git(root, "mv", str(source), str(target))
    for name, text in NEW_FILES.items():
        path = package / name
        if path.exists():
            continue
        changed.append(f"{PACKAGE}/{name} (new)")
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            _git(root, "add", str(path))
    runner = package / "runner/__init__.py"
    if runner.exists():
        text = runner.read_text(encoding="utf-8")
        stripped = _MAIN_BLOCK.sub("\n", text)
        if stripped != text:
            changed.append(f"{PACKAGE}/runner/__init__.py (__main__ block -> runner/__main__.py)")
            if not check:
                runner.write_text(stripped, encoding="utf-8")
    return changed


def _files(root: Path) -> list[Path]:
    listed = _git(
        root, "ls-files", "--cached", "--others", "--exclude-standard", "--", *REWRITE_ROOTS
    )
    files = []
    for name in sorted(set(listed.splitlines())):
        path = root / name
        suffix = path.suffix if path.suffix else ""
        if name == THIS_FILE or not path.is_file():
            continue
        if suffix in TEXT_SUFFIXES or path.name.endswith("Dockerfile"):
            files.append(path)
    return files


def _tidy(root: Path, names: list[str]) -> None:
    """Re-sort the imports and re-wrap the lines of the rewritten files (longer module names move
    imports and lengthen lines), with the project's ruff, as the lint and format checks expect."""
    ruff = root / ".venv/bin/ruff"
    command = str(ruff) if ruff.exists() else shutil.which("ruff")
    if command is None or not names:
        if names:
            print(
                "ruff not found: run `ruff check --select I --fix` and `ruff format` on the output"
            )
        return
    subprocess.run(
        [command, "check", "-q", "--select", "I", "--fix", *names], cwd=root, check=False
    )
    subprocess.run([command, "format", "-q", *names], cwd=root, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="list what would change; change nothing"
    )
    args = parser.parse_args()
    root = Path(_git(Path(__file__).resolve().parent, "rev-parse", "--show-toplevel").strip())
    changed = _move(root, args.check)
    for path in _files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = rewrite(text)
        if new != text:
            changed.append(str(path.relative_to(root)))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if not args.check:
        _tidy(root, [name for name in changed if name.endswith(".py") and (root / name).is_file()])
    for line in changed:
        print(line)
    if args.check:
        return 1 if changed else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
