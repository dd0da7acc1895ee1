"""A dataset version's settings as a step uses them, read in one statement per request.

A step needs its dataset's rule-set path (when it decides and again when it builds the view),
its auditor settings, its DP configuration (for the ledger's lock and again for the context)
and the claims each kind requires: each was one read of its own, six statements per reveal.
`StepSettings.read` fetches them together (the dataset row joined to the three settings tables),
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
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Row, Table, bindparam, select

from safeaccess.server.config import DEFAULT_QSS, QssSettings
from safeaccess.server.store.schema import (
    ClaimRequirementRow,
    DatasetRow,
    DPConfigRow,
    QssSettingsRow,
)

if TYPE_CHECKING:
    from safeaccess.server.store import Store


@dataclass(frozen=True)
class StepSettings:
    """The settings of one dataset version that a step reads (see the module's docstring)."""

    dataset_id: int
    name: str
    rules_path: str | None
    qss: QssSettings
    dp_config: dict[str, Any] | None
    requirements: dict[str, frozenset[str]]

    @classmethod
    def read(cls, store: Store, dataset_id: int) -> StepSettings | None:
        """The settings of dataset version `dataset_id` now, in one statement (None: no such
        version)."""
        with store.reading() as conn:
            rows = conn.execute(_SETTINGS, {"dataset_id": dataset_id}).all()
        return cls.of_rows(dataset_id, rows)

    @classmethod
    def of_rows(cls, dataset_id: int, rows: Sequence[Row[*tuple[Any, ...]]]) -> StepSettings | None:
        """The settings from rows of `SETTINGS_COLUMNS` joined as in `SETTINGS_JOIN`, one per
        required claim (None: no rows, no such version). A caller may read them as part of
        a larger statement (the worker's read of a queued step, `queue.read_job_step`)."""
        if not rows:
            return None
        first = rows[0]
        qss = (
            DEFAULT_QSS
            if first.mode is None
            else QssSettings(mode=first.mode, scope=first.scope, atom_cap=first.atom_cap)
        )
        found: dict[str, set[str]] = {}
        for row in rows:
            if row.kind is not None:
                found.setdefault(str(row.kind), set()).add(str(row.claim))
        return cls(
            dataset_id=dataset_id,
            name=str(first.name),
            rules_path=first.rules_path,
            qss=qss,
            dp_config=None if first.config is None else dict(first.config),
            requirements={kind: frozenset(claims) for kind, claims in found.items()},
        )


@dataclass
class _Scope:
    store: Store
    by_id: dict[int, StepSettings] = field(default_factory=dict)
    by_name: dict[str, StepSettings] = field(default_factory=dict)


_CURRENT: ContextVar[_Scope | None] = ContextVar("safeaccess_step_settings", default=None)


@contextlib.contextmanager
def settings_scope(store: Store) -> Iterator[None]:
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


def settings_of(store: Store, dataset_id: int) -> StepSettings | None:
    """The settings of version `dataset_id`: from the open scope if it read them, else read
    now (and kept by the scope, if one is open)."""
    scope = _CURRENT.get()
    if scope is not None and scope.store is store:
        cached = scope.by_id.get(dataset_id)
        if cached is not None:
            return cached
    settings = StepSettings.read(store, dataset_id)
    if settings is not None:
        keep(store, settings)
    return settings


def keep(store: Store, settings: StepSettings) -> None:
    """Keep `settings`, read by the caller as part of another statement, in the open scope (if
    any), as `settings_of` keeps what it reads."""
    scope = _CURRENT.get()
    if scope is not None and scope.store is store:
        scope.by_id[settings.dataset_id] = settings
        scope.by_name[settings.name] = settings


def in_scope(store: Store) -> bool:
    """Whether a scope over `store` is open here."""
    scope = _CURRENT.get()
    return scope is not None and scope.store is store


def scoped_by_name(store: Store, name: str) -> StepSettings | None:
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
# Built once. One row per required claim (or one row with NULL kind and claim if none): the
# dataset's columns repeat on each, which costs less than a statement per table.
SETTINGS_COLUMNS = (
    _DATASETS.c.name,
    _DATASETS.c.rules_path,
    _QSS.c.mode,
    _QSS.c.scope,
    _QSS.c.atom_cap,
    _DP.c.config,
    _CLAIMS.c.kind,
    _CLAIMS.c.claim,
)
#: The dataset's row joined to its settings (select from it, with `datasets.id` to match).
SETTINGS_JOIN = (
    _DATASETS.outerjoin(_QSS, _QSS.c.dataset == _DATASETS.c.name)
    .outerjoin(_DP, _DP.c.dataset == _DATASETS.c.name)
    .outerjoin(_CLAIMS, _CLAIMS.c.dataset == _DATASETS.c.name)
)
_SETTINGS = (
    select(*SETTINGS_COLUMNS)
    .select_from(SETTINGS_JOIN)
    .where(_DATASETS.c.id == bindparam("dataset_id"))
)
