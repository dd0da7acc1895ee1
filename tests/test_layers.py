"""The layout's guards: distributions depend one way, no module imports itself around a cycle,
and SQL is spoken only by the store (see ../shared/notes/server-layout.md).

Imports are read with `ast`, never executed. `from package import name` is followed to the
module the package's `__init__` takes `name` from, so a package re-exporting its parts is not a
cycle by itself (for the same reason the parent packages a submodule import runs are not edges).
Cycles are counted between modules, imports inside functions and under `if TYPE_CHECKING:`
included: a type import is still a dependency (mypy and a reader resolve both modules at once,
and it turns into a run-time cycle as soon as the type is used at run time); only the
distribution-direction test reads run-time imports alone. No cycle is left: any cycle fails
the suite. No SQL and no SQLAlchemy import is left
outside the store but the modules listed below, each to be moved.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

STORE = ("safeaccess.server.store",)
ROOT = Path(__file__).resolve().parents[1]
SOURCES = {name: ROOT / name / "src" for name in ("client", "rules", "sandbox", "server")}
#: What each distribution may import of ours (rules and client are free of the others).
ALLOWED = {
    "client": {"client"},
    "rules": {"rules"},
    "sandbox": {"client", "rules", "sandbox"},
    "server": {"client", "rules", "sandbox", "server"},
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for src in SOURCES.values():
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


@cache
def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"))


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _absolute(name: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if _is_package(name) else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(module: str) -> str | None:
    while module and module not in MODULES:
        module = module.rpartition(".")[0]
    return module or None


def _source_of(package: str, attribute: str, seen: frozenset[str] = frozenset()) -> str:
    """The module a package's `__init__` takes `attribute` from (the package itself if defined
    there)."""
    if f"{package}.{attribute}" in MODULES:
        return f"{package}.{attribute}"
    if package in seen:
        return package
    for node in _tree(package).body:
        if isinstance(node, ast.ImportFrom) and any(
            (a.asname or a.name) == attribute for a in node.names
        ):
            origin = _owner(_absolute(package, node))
            if origin is None:
                return package
            if _is_package(origin) and origin != package:
                return _source_of(origin, attribute, seen | {package})
            return origin
    return package


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run: `if TYPE_CHECKING:` blocks are skipped (types only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for other in node.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield node
        yield from _runtime_nodes(node)


@cache
def imports_of(name: str, *, types: bool = False) -> frozenset[str]:
    """Our modules that module `name` imports when it runs (at any depth, functions too), and
    with `types` also under `if TYPE_CHECKING:`."""
    out: set[str] = set()
    nodes = ast.walk(_tree(name)) if types else _runtime_nodes(_tree(name))
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                owner = _owner(alias.name)
                if owner is not None:
                    out.add(owner)
        elif isinstance(node, ast.ImportFrom):
            target = _owner(_absolute(name, node))
            if target is None:
                continue
            for alias in node.names:
                if _is_package(target):
                    out.add(_source_of(target, alias.name))
                else:
                    out.add(target)
    out.discard(name)
    return frozenset(m for m in out if m.startswith("safeaccess."))


def _distribution(module: str) -> str:
    return module.split(".")[1]


def test_the_distributions_depend_one_way() -> None:
    wrong = [
        f"{name} -> {dep}"
        for name in MODULES
        for dep in imports_of(name)
        if _distribution(dep) not in ALLOWED[_distribution(name)]
    ]
    assert wrong == []


@cache
def _cycles() -> tuple[frozenset[str], ...]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    graph = {name: sorted(imports_of(name, types=True)) for name in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return tuple(found)


#: Cycles the layout issue has broken, checked by name so that a regression says which one.
BROKEN_CYCLES = {
    # The client's cards read what they show through `cards.py`'s protocols, plots read a step
    # through their own, and the sealed sequence draws its card with `cards.py`'s helpers.
    "client-notebook": {"safeaccess.client.notebook", "safeaccess.client.results"},
    "client-plots-results": {"safeaccess.client.plots", "safeaccess.client.results"},
    "client-protocol-notebook": {
        "safeaccess.client.protocol.sealed",
        "safeaccess.client.notebook",
    },
    "service-audit_service": {"safeaccess.server.service", "safeaccess.server.auditors"},
    "qss-state-codec": {"safeaccess.rules.qss.state", "safeaccess.rules.qss.codec"},
    # The store's modules take a `store.database.Database`, never the `Store` facade above them.
    "store-facade": {"safeaccess.server.store", "safeaccess.server.store.sequences"},
    "store-review-scripts-sequences": {
        "safeaccess.server.store.review",
        "safeaccess.server.store.sequences",
    },
    "store-database-settings": {
        "safeaccess.server.store.database",
        "safeaccess.server.store.step_settings",
    },
}


def test_no_import_cycle() -> None:
    assert [sorted(c) for c in _cycles()] == []


@pytest.mark.parametrize("name", sorted(BROKEN_CYCLES))
def test_broken_cycle_stays_broken(name: str) -> None:
    members = BROKEN_CYCLES[name]
    assert not any(members <= c for c in _cycles())


def test_the_client_cards_import_no_result_type() -> None:
    # The cards read plans, results, DP answers, models and rehearsals through `cards.py`'s
    # protocols; the types import the cards to draw themselves, never the other way.
    assert imports_of("safeaccess.client.notebook", types=True) <= {
        "safeaccess.client.cards",
        "safeaccess.client.protocol.sealed",
        "safeaccess.client.synthetic_result",
    }
    assert imports_of("safeaccess.client.cards", types=True) == frozenset()


def test_the_client_protocol_imports_nothing_above_it() -> None:
    # The protocol (which the server verifies with) needs only itself and the card helpers.
    above = {
        dep
        for name in MODULES
        if name.startswith("safeaccess.client.protocol")
        for dep in imports_of(name, types=True)
        if not dep.startswith("safeaccess.client.protocol")
    }
    assert above <= {"safeaccess.client.cards"}


def test_the_cycle_finder_sees_type_imports() -> None:
    # Guards the guard: the cycle the store had ran through `if TYPE_CHECKING:` imports only,
    # so a finder reading run-time imports alone would have passed it.
    source = MODULES["safeaccess.server.store.ledgers"].read_text(encoding="utf-8")
    assert "if TYPE_CHECKING:" in source
    assert "safeaccess.server.store.database" in imports_of(
        "safeaccess.server.store.ledgers", types=True
    )
    assert "safeaccess.server.store.database" not in imports_of("safeaccess.server.store.ledgers")


#: What the store may import of the server: the vocabulary below it. Everything else of the
#: server (jobs, steps, qss, review, web, http, admin, service, ...) sits above the store.
BELOW_THE_STORE = (
    "safeaccess.server.audit.records",
    "safeaccess.server.config",
    "safeaccess.server.errors",
    "safeaccess.server.outcome",
    "safeaccess.server.states",
)


def _store_imports() -> set[str]:
    return {
        dep
        for name in MODULES
        if name.startswith(STORE)
        for dep in imports_of(name, types=True)
        if dep.startswith("safeaccess.server.") and not dep.startswith(STORE)
    }


def test_the_store_imports_nothing_above_it() -> None:
    assert _store_imports() - set(BELOW_THE_STORE) == set()


def test_the_store_modules_never_import_their_facade() -> None:
    # The store's modules take a `Database`; only the package's `__init__` builds on them.
    users = {
        name
        for name in MODULES
        if name.startswith("safeaccess.server.store.")
        and "safeaccess.server.store" in imports_of(name, types=True)
    }
    assert users == set()


def test_the_store_imports_nothing_of_the_jobs() -> None:
    # The queue's vocabulary (`QueuedJob`, the task and queue names, `step_job`) is the
    # store's own (`store.queue`): the job layer imports it from there, never the other way.
    assert {d for d in _store_imports() if d.startswith("safeaccess.server.jobs")} == set()


def test_nothing_below_the_jobs_imports_them() -> None:
    # The steps describe a step's job with `store.queue.step_job`; only the layers on top of
    # the job layer (and the job layer itself) import it.
    above = tuple(f"safeaccess.server.{name}" for name in ("admin", "demo", "http", "jobs", "web"))
    below = {
        f"{name} -> {dep}"
        for name in MODULES
        if name.startswith("safeaccess.server.") and not name.startswith(above)
        for dep in imports_of(name, types=True)
        if dep.startswith("safeaccess.server.jobs")
    }
    assert below == set()


#: The layers above the steps that may use the `Store` facade: the job layer and what stands
#: on it (the web workspace, the HTTP app, the demo, the admin CLI), and the service that wires
#: them. Every other module of the server takes a `store.database.Database` and calls the store
#: module of its job, so its data goes down to the store once and does not come back up.
FACADE_USERS = tuple(
    f"safeaccess.server.{name}" for name in ("admin", "demo", "http", "jobs", "service", "web")
)
#: Few enough delegates that each is shared by several callers (the issue's bound).
MAX_FACADE_METHODS = 25


def _facade_methods() -> list[str]:
    (store,) = (
        node
        for node in _tree("safeaccess.server.store").body
        if isinstance(node, ast.ClassDef) and node.name == "Store"
    )
    return [
        node.name
        for node in store.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.name.startswith("_")
    ]


def test_the_store_facade_stays_thin() -> None:
    assert 0 < len(_facade_methods()) <= MAX_FACADE_METHODS


def test_nothing_below_the_jobs_imports_the_store_facade() -> None:
    below = {
        name
        for name in MODULES
        if name.startswith("safeaccess.server.")
        and not name.startswith(FACADE_USERS)
        and "safeaccess.server.store" in imports_of(name, types=True)
    }
    assert below == set()


def test_the_facade_guard_sees_the_facade() -> None:
    # Guards the guard: the service imports `Store` from the package itself, and a module
    # importing a store module through the package (`from safeaccess.server.store import
    # sequences`) is not counted as importing the facade.
    assert "safeaccess.server.store" in imports_of("safeaccess.server.service")
    assert "safeaccess.server.store" not in imports_of("safeaccess.server.steps.flow", types=True)
    assert "safeaccess.server.store.sequences" in imports_of("safeaccess.server.steps.flow")
    assert "get_sequence" in _facade_methods()


_SQL = re.compile(r"\b(select|insert|update|delete)\(|\.execute\(|\btext\(\"|\bwith_for_update\(")
#: ORM calls on a session a module got from `store.transaction()`: SQL without importing
#: SQLAlchemy (`s.query(...)`, `s.get(Row, key)`, `s.add(row)`, ...).
_SESSION_SQL = re.compile(
    r"\b(s|session)\.(add|add_all|delete|execute|flush|get|merge|query|refresh|scalars?)\("
)


def _speaks_sql(name: str) -> bool:
    if not name.startswith("safeaccess.server."):
        return False
    source = MODULES[name].read_text(encoding="utf-8")
    uses_sqlalchemy = "sqlalchemy" in source
    return (uses_sqlalchemy and bool(_SQL.search(source))) or bool(_SESSION_SQL.search(source))


def test_no_sql_outside_the_store() -> None:
    speaking = {n for n in MODULES if _speaks_sql(n) and not n.startswith(STORE)}
    assert speaking == set()


#: The modules whose SQL the layout moved into the store, checked by name so that a regression
#: says which one.
MOVED_SQL = (
    "safeaccess.server.admin.accounts",
    "safeaccess.server.config",
    "safeaccess.server.steps.claims",
    "safeaccess.server.admin.cli",
    "safeaccess.server.dataset_rules",
    "safeaccess.server.review.rules",
    "safeaccess.server.steps.scripts",
    "safeaccess.server.web.accounts",
)


@pytest.mark.parametrize("name", MOVED_SQL)
def test_moved_sql_stays_in_the_store(name: str) -> None:
    assert not _speaks_sql(name)


def test_the_sql_detector_sees_sql() -> None:
    # Guards the guard: the store's own modules speak SQL by this test's definition, so a
    # detector that went blind would fail here rather than pass everything.
    assert _speaks_sql("safeaccess.server.store.sequences")
    assert _speaks_sql("safeaccess.server.store.log")
    # The SQL that needs no SQLAlchemy import: a session's ORM calls.
    assert _SESSION_SQL.search("rows = list(s.query(DatasetRow).order_by(DatasetRow.name))")
    assert _SESSION_SQL.search("row = session.get(CheckerRow, name)")
    assert not _SESSION_SQL.search("cached = self._keys.get(name)")


def _imports_sqlalchemy(name: str) -> bool:
    """Whether module `name` imports SQLAlchemy anywhere (functions and type imports too)."""
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "sqlalchemy" for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            return True
    return False


#: The modules outside the store that still import SQLAlchemy, each to be moved into it: other
#: branches of the layout issue are rewriting these files (the admin CLI as a table of commands,
#: the HTTP app, the job queue). None may be added; remove each as it goes.
SQLALCHEMY_OUTSIDE_THE_STORE = frozenset(
    {
        "safeaccess.server.admin.db",
        "safeaccess.server.http.app",
        "safeaccess.server.jobs.tasks",
    }
)
#: Modules whose SQLAlchemy imports moved into the store (the audit log and its frontier are
#: `store/auditlog.py` and `store/frontier.py`, the database URL check and the admin CLI's
#: URL redaction `store/urls.py`).
MOVED_SQLALCHEMY = ("safeaccess.server.config", "safeaccess.server.admin.cli")


def test_sqlalchemy_is_imported_only_in_the_store() -> None:
    found = {
        n
        for n in MODULES
        if n.startswith("safeaccess.") and not n.startswith(STORE) and _imports_sqlalchemy(n)
    }
    assert found - SQLALCHEMY_OUTSIDE_THE_STORE == set()


@pytest.mark.parametrize("name", MOVED_SQLALCHEMY)
def test_moved_sqlalchemy_stays_in_the_store(name: str) -> None:
    assert not _imports_sqlalchemy(name)


def test_the_sqlalchemy_detector_sees_imports() -> None:
    # Guards the guard: a type-only import counts, and so does one inside a function.
    assert _imports_sqlalchemy("safeaccess.server.store.auditlog")  # `if TYPE_CHECKING:` only
    assert _imports_sqlalchemy("safeaccess.server.store.urls")


def test_relative_imports_are_followed_to_their_module() -> None:
    # Guards the guard: `from . import x` names a module of the package, not the package.
    node = ast.parse("from . import review").body[0]
    assert isinstance(node, ast.ImportFrom)
    package = _absolute("safeaccess.server.store.sequences", node)
    assert package == "safeaccess.server.store"
    assert _source_of(package, "review") == "safeaccess.server.store.review"
    up = ast.parse("from ..errors import Conflict").body[0]
    assert isinstance(up, ast.ImportFrom)
    assert _absolute("safeaccess.server.store.sequences", up) == "safeaccess.server.errors"
