"""A dataset version's settings as a step uses them, read in one statement per request.

A step needs its dataset's rule-set path (when it decides and again when it builds the view),
its auditor settings, its DP configuration (for the ledger's lock and again for the context)
and the claims each kind requires, and the ids of every version of its name (the query-set
auditor's populations): each was one read of its own, seven statements per reveal.
`StepSettings.read` fetches them together (the dataset row joined to the three settings tables
and to its name's versions),
and `settings_scope` keeps what it read for the rest of one request, so every later lookup of
the same dataset in that request is answered from memory.

Why only for one request: an administrator changes these rows from another process (`dataset
rules`, `dp`, `qss`, `claims`) and no replica hears of it; reading them again at every request
keeps "the change applies from the next step on". Within a request they are read once, which
is also more consistent than before (the DP ledger's lock and the DP context now see the same
configuration).

The scope lives in a context variable, so it covers exactly the code that runs on the request's
thread inside the `with`, and a store other than the one that read it never sees it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import ColumnElement, Connection, FromClause, Join, Table, bindparam, select

from safeaccess.server.config import DEFAULT_QSS, QssSettings
from safeaccess.server.store.schema import (
    ClaimRequirementRow,
    DatasetRow,
    DPConfigRow,
    QssSettingsRow,
)


class Statements(Protocol):
    """What the settings read of a store: one statement (`database.Database` has it; the
    database imports the migrations, which import this module, so it is named here)."""

    def one_statement(self) -> AbstractContextManager[Connection]: ...


@dataclass(frozen=True)
class StepSettings:
    """The settings of one dataset version that a step reads (see the module's docstring)."""

    dataset_id: int
    name: str
    rules_path: str | None
    qss: QssSettings
    dp_config: dict[str, Any] | None
    requirements: dict[str, frozenset[str]]
    #: The ids of every registered version of the dataset's name, oldest first.
    version_ids: tuple[int, ...] = ()

    @classmethod
    def read(cls, store: Statements, dataset_id: int) -> StepSettings | None:
        """The settings of dataset version `dataset_id` now, in one statement (None: no such
        version)."""
        with store.one_statement() as conn:
            rows = conn.execute(_SETTINGS, {"dataset_id": dataset_id}).all()
        return cls.of_rows(dataset_id, rows)

    def to_args(self) -> dict[str, Any]:
        """These settings as JSON values (carried by a step's job: `queue.Carried`)."""
        return {
            "dataset_id": self.dataset_id,
            "name": self.name,
            "rules_path": self.rules_path,
            "qss": self.qss.model_dump(mode="json"),
            "dp_config": self.dp_config,
            "requirements": {kind: sorted(claims) for kind, claims in self.requirements.items()},
            "version_ids": list(self.version_ids),
        }

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> StepSettings:
        """The settings `to_args` gave (KeyError, TypeError or ValueError if they are not)."""
        return cls(
            dataset_id=int(args["dataset_id"]),
            name=str(args["name"]),
            rules_path=None if args["rules_path"] is None else str(args["rules_path"]),
            qss=QssSettings.model_validate(args["qss"]),
            dp_config=None if args["dp_config"] is None else dict(args["dp_config"]),
            requirements={
                str(kind): frozenset(str(c) for c in claims)
                for kind, claims in dict(args["requirements"]).items()
            },
            version_ids=tuple(int(i) for i in args["version_ids"]),
        )

    @classmethod
    def of_rows(cls, dataset_id: int, rows: Sequence[Any]) -> StepSettings | None:
        """The settings from the rows of `_SETTINGS` (or of a statement that joins its
        `COLUMNS` the same way, `joined`); None when there are none."""
        if not rows:
            return None
        first = rows[0]
        qss = (
            DEFAULT_QSS
            if first.mode is None
            else QssSettings(mode=first.mode, scope=first.scope, atom_cap=first.atom_cap)
        )
        found: dict[str, set[str]] = {}
        versions: dict[int, int] = {}
        for row in rows:
            if row.kind is not None:
                found.setdefault(str(row.kind), set()).add(str(row.claim))
            versions[int(row.version_id)] = int(row.version)
        return cls(
            dataset_id=dataset_id,
            name=str(first.name),
            rules_path=first.rules_path,
            qss=qss,
            dp_config=None if first.config is None else dict(first.config),
            requirements={kind: frozenset(claims) for kind, claims in found.items()},
            version_ids=tuple(sorted(versions, key=versions.__getitem__)),
        )


@dataclass
class _Scope:
    store: Statements
    by_id: dict[int, StepSettings] = field(default_factory=dict)
    by_name: dict[str, StepSettings] = field(default_factory=dict)


_CURRENT: ContextVar[_Scope | None] = ContextVar("safeaccess_step_settings", default=None)


@contextlib.contextmanager
def settings_scope(store: Statements) -> Iterator[None]:
    """Within the `with`, each dataset version's settings are read from `store` at most once
    (a scope already open for the same store is reused: nested requests share it)."""
    current = _CURRENT.get()
    if current is not None and current.store is store:
        yield
        return
    token = _CURRENT.set(_Scope(store))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def prime(store: Statements, settings: StepSettings) -> None:
    """Hand the open scope (if any, over `store`) settings read by another statement."""
    scope = _CURRENT.get()
    if scope is not None and scope.store is store:
        scope.by_id[settings.dataset_id] = settings
        scope.by_name[settings.name] = settings


def scope_is_empty(store: Statements) -> bool:
    """Whether a scope over `store` is open here and has read nothing yet."""
    scope = _CURRENT.get()
    return scope is not None and scope.store is store and not scope.by_id


def settings_of(store: Statements, dataset_id: int) -> StepSettings | None:
    """The settings of version `dataset_id`: from the open scope if it read them, else read
    now (and kept by the scope, if one is open)."""
    scope = _CURRENT.get()
    if scope is not None and scope.store is store:
        cached = scope.by_id.get(dataset_id)
        if cached is not None:
            return cached
    settings = StepSettings.read(store, dataset_id)
    if settings is not None:
        prime(store, settings)
    return settings


def scoped_by_id(store: Statements, dataset_id: int) -> StepSettings | None:
    """The settings the open scope over `store` holds for version `dataset_id` (never read
    here), or None."""
    scope = _CURRENT.get()
    if scope is None or scope.store is not store:
        return None
    return scope.by_id.get(dataset_id)


def in_scope(store: Statements) -> bool:
    """Whether a scope over `store` is open here."""
    scope = _CURRENT.get()
    return scope is not None and scope.store is store


def scoped_by_name(store: Statements, name: str) -> StepSettings | None:
    """The settings the open scope holds for dataset name `name` (any of its versions: the
    auditor settings, DP configuration and claims belong to the name), or None."""
    scope = _CURRENT.get()
    if scope is None or scope.store is not store:
        return None
    return scope.by_name.get(name)


_DATASETS: Table = DatasetRow.__table__  # type: ignore[assignment]
_QSS: Table = QssSettingsRow.__table__  # type: ignore[assignment]
_DP: Table = DPConfigRow.__table__  # type: ignore[assignment]
_CLAIMS: Table = ClaimRequirementRow.__table__  # type: ignore[assignment]
_VERSIONS = _DATASETS.alias("versions")
# Built once. One row per required claim and version of the name (at least one: the version
# itself; NULL kind and claim if none are required): the dataset's columns repeat on each, which
# costs less than a statement per table.
#: The columns `StepSettings.of_rows` reads.
COLUMNS = (
    _DATASETS.c.name,
    _DATASETS.c.rules_path,
    _QSS.c.mode,
    _QSS.c.scope,
    _QSS.c.atom_cap,
    _DP.c.config,
    _CLAIMS.c.kind,
    _CLAIMS.c.claim,
    _VERSIONS.c.id.label("version_id"),
    _VERSIONS.c.version,
)


def joined(left: FromClause, dataset_id: ColumnElement[Any]) -> Join:
    """`left` joined to the dataset version `dataset_id` (a column of `left`) and to the
    tables `COLUMNS` come from."""
    return (
        left.join(_DATASETS, _DATASETS.c.id == dataset_id)
        .outerjoin(_QSS, _QSS.c.dataset == _DATASETS.c.name)
        .outerjoin(_DP, _DP.c.dataset == _DATASETS.c.name)
        .outerjoin(_CLAIMS, _CLAIMS.c.dataset == _DATASETS.c.name)
        .join(_VERSIONS, _VERSIONS.c.name == _DATASETS.c.name)
    )


_SETTINGS = (
    select(*COLUMNS)
    .select_from(
        _DATASETS.outerjoin(_QSS, _QSS.c.dataset == _DATASETS.c.name)
        .outerjoin(_DP, _DP.c.dataset == _DATASETS.c.name)
        .outerjoin(_CLAIMS, _CLAIMS.c.dataset == _DATASETS.c.name)
        .join(_VERSIONS, _VERSIONS.c.name == _DATASETS.c.name)
    )
    .where(_DATASETS.c.id == bindparam("dataset_id"))
)
