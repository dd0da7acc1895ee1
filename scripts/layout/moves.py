"""The engine of the layout moves: `git mv` a distribution's modules and rewrite every reference.

A move script (`move_sandbox.py`, `move_server.py`) describes one distribution's move as a
`Layout` (which module goes where, the new packages' files) and calls `run(layout)`. The engine:

1. `git mv`s each path in `Layout.moves` to its new path (skipped where that is already done);
2. writes the new packages' files (`Layout.new_files`) where they are missing, then calls the
   layout's own fix-up (`Layout.fixup`), if any;
3. rewrites, in every file git tracks (or would track) under `Layout.rewrite_roots`, the dotted
   module names (imports, `-m` arguments, module-name strings, monkeypatch targets, entry
   points, prose) and the file paths (the long `<dist>/src/safeaccess/<dist>/` form and the
   short `<dist>/` form the docs use), and turns `from safeaccess.<dist> import old` into an
   import from the module's new parent package.

Idempotent: every pattern names an old path that no new path contains (a module that becomes a
package is guarded by the names the new package holds), so on a moved tree nothing matches and
nothing changes; run again after merging a branch written against the old layout, it rewrites
that branch's files. No shims are left at the old paths. The move scripts themselves (everything
under `scripts/layout/`) name the old paths on purpose and are never rewritten.

`--check` lists the files that would change and exits 1 if there are any.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: Where the move scripts live; never rewritten (they name the old layout by design).
SCRIPTS_DIR = "scripts/layout/"

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
    ".mako",
    ".Dockerfile",
    ".service",
    ".conf",
    "",
}


@dataclass(frozen=True)
class Layout:
    """One distribution's move.

    `modules` maps old dotted names (below `safeaccess.<dist>`) to new ones; a package keeps its
    dotted name for its children. `moves` maps old paths to new paths below the package's
    source directory. `package_exports` names what a module-turned-package exports itself
    (references to those are new-layout references). `fixup(root, package, check)` makes
    any other change the move needs and returns descriptions of what it changed (or would).
    """

    dist: str
    modules: Mapping[str, str]
    moves: Mapping[str, str]
    rewrite_roots: tuple[str, ...]
    package_exports: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    new_files: Mapping[str, str] = field(default_factory=dict)
    fixup: Callable[[Path, Path, bool], list[str]] | None = None

    @property
    def package(self) -> str:
        """The package's source directory, relative to the repository root."""
        return f"{self.dist}/src/safeaccess/{self.dist}"

    @property
    def dotted(self) -> str:
        """The package's dotted name."""
        return f"safeaccess.{self.dist}"


def git(root: Path, *args: str) -> str:
    """Run git in `root` and return its standard output."""
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout


def _new_package_names(layout: Layout, old: str) -> set[str]:
    """What the new package `old` holds itself: its submodules and its exports."""
    children = {
        m.split(".", 1)[1].split(".")[0] for m in layout.modules.values() if m.startswith(old + ".")
    }
    return children | set(layout.package_exports.get(old, ()))


def _dotted_patterns(layout: Layout) -> list[tuple[re.Pattern[str], str]]:
    prefix = re.escape(layout.dotted) + r"\."
    patterns = []
    for old, new in layout.modules.items():
        guard = ""
        if new.startswith(old + "."):
            # `old` becomes a package: a name already below it (review.decisions) is new.
            alternatives = "|".join(sorted(_new_package_names(layout, old)))
            # `from <dotted>.<old> import ...` is decided by what it imports
            # (`_rewrite_from_new_package`).
            guard = r"(?!\.(?:" + alternatives + r")\b)(?!\s+import\b)"
        patterns.append(
            (
                re.compile(r"(?<![\w.])" + prefix + re.escape(old) + r"(?!\w)" + guard),
                f"{layout.dotted}.{new}",
            )
        )
    return patterns


def _path_patterns(layout: Layout) -> list[tuple[re.Pattern[str], str]]:
    dist = re.escape(layout.dist)
    patterns = []
    for old, new in layout.moves.items():
        tail = re.escape(old) + r"(?![\w])"
        # safeaccess/<dist>/<old> (an installed or source path), or <dist>/<old> on its own
        # (the short form the docs use; not tests/<dist>/<old>).
        patterns.append(
            (
                re.compile(r"(?<![\w.-])((?:" + dist + r"/src/)?safeaccess/" + dist + r"/)" + tail),
                r"\g<1>" + new,
            )
        )
        patterns.append((re.compile(r"(?<![\w./-])(" + dist + r"/)" + tail), r"\g<1>" + new))
    return patterns


def _rewrite_from_package(layout: Layout, text: str) -> str:
    """`from safeaccess.<dist> import old, kept` -> one import per moved module."""
    pattern = re.compile(
        r"^(?P<indent>[ \t]*)from "
        + re.escape(layout.dotted)
        + r" import (?P<names>[\w ,]+?)(?P<comment>[ \t]*#.*)?$",
        re.MULTILINE,
    )

    def repl(match: re.Match[str]) -> str:
        names = [n.strip() for n in match.group("names").split(",") if n.strip()]
        if not any(n.split(" as ")[0].strip() in layout.modules for n in names):
            return match.group(0)
        indent, comment = match.group("indent"), match.group("comment") or ""
        kept, lines = [], []
        for name in names:
            module, _, alias = (part.strip() for part in name.partition(" as "))
            if module not in layout.modules:
                kept.append(name)
                continue
            parent, _, leaf = f"{layout.dotted}.{layout.modules[module]}".rpartition(".")
            bound = alias or module
            line = f"{indent}from {parent} import {leaf}"
            lines.append(line + (f" as {bound}" if bound != leaf else "") + comment)
        if kept:
            lines.insert(0, f"{indent}from {layout.dotted} import {', '.join(kept)}{comment}")
        return "\n".join(lines)

    return pattern.sub(repl, text)


def _rewrite_from_new_package(layout: Layout, text: str) -> str:
    """`from safeaccess.<dist>.<old> import X, Y` where `old` became a package: left alone when
    every name is one the new package holds, else an old-layout import of the module that moved
    into the package, rewritten to import from there."""
    for old, new in layout.modules.items():
        if not new.startswith(old + "."):
            continue
        held = _new_package_names(layout, old)
        pattern = re.compile(
            r"(?<![\w.])from "
            + re.escape(f"{layout.dotted}.{old}")
            + r"(\s+import\s+)(\([^)]*\)|[^\n]*)"
        )

        def repl(match: re.Match[str], held: set[str] = held, new: str = new) -> str:
            body = re.sub(r"#[^\n]*", "", match.group(2)).strip("() \n")
            names = {n.split(" as ")[0].strip() for n in body.split(",") if n.strip()}
            if names <= held:
                return match.group(0)
            return f"from {layout.dotted}.{new}{match.group(1)}{match.group(2)}"

        text = pattern.sub(repl, text)
    return text


def rewrite(layout: Layout, text: str) -> str:
    """`text` with every reference to an old module or path of `layout` replaced by the new one."""
    for pattern, new in _dotted_patterns(layout):
        text = pattern.sub(new, text)
    text = _rewrite_from_new_package(layout, text)
    # After the dotted names: the imports it writes name new modules only.
    text = _rewrite_from_package(layout, text)
    for pattern, new in _path_patterns(layout):
        text = pattern.sub(new, text)
    return text


def _move(layout: Layout, root: Path, check: bool) -> list[str]:
    changed = []
    package = root / layout.package
    for old, new in layout.moves.items():
        source, target = package / old, package / new
        if not source.exists():
            continue
        if target.exists():
            sys.exit(f"both {layout.package}/{old} and {layout.package}/{new} exist: merge first")
        changed.append(f"{layout.package}/{old} -> {layout.package}/{new}")
        if not check:
            target.parent.mkdir(parents=True, exist_ok=True)
            git(root, "mv", str(source), str(target))
    for name, text in layout.new_files.items():
        path = package / name
        if path.exists():
            continue
        changed.append(f"{layout.package}/{name} (new)")
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            git(root, "add", str(path))
    if layout.fixup is not None:
        changed += layout.fixup(root, package, check)
    return changed


def _files(layout: Layout, root: Path) -> list[Path]:
    listed = git(
        root, "ls-files", "--cached", "--others", "--exclude-standard", "--", *layout.rewrite_roots
    )
    files = []
    for name in sorted(set(listed.splitlines())):
        path = root / name
        if name.startswith(SCRIPTS_DIR) or not path.is_file():
            continue
        if path.suffix in TEXT_SUFFIXES or path.name.endswith("Dockerfile"):
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


def run(layout: Layout, description: str) -> int:
    """Parse `--check`, apply (or list) the move of `layout`; the exit status of a move script."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--check", action="store_true", help="list what would change; change nothing"
    )
    args = parser.parse_args()
    root = Path(git(Path(__file__).resolve().parent, "rev-parse", "--show-toplevel").strip())
    changed = _move(layout, root, args.check)
    for path in _files(layout, root):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = rewrite(layout, text)
        if new != text:
            changed.append(str(path.relative_to(root)))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if not args.check:
        _tidy(root, [name for name in changed if name.endswith(".py") and (root / name).is_file()])
    for line in changed:
        print(line)
    if not changed:
        print("nothing to change")
    if args.check:
        return 1 if changed else 0
    return 0
