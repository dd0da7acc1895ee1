"""The centre's catalogue: projects, researchers and their keys, auditors, dataset versions and
their settings (query-set auditor, DP, rule-set file), and request nonces.

Every change is logged in the audit log in its own transaction.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Table, bindparam, delete, func, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from safeaccess.client.keyrotation import REVOKED, ROTATED, rotation_signed_by
from safeaccess.client.keys import load_public_key
from safeaccess.server.config import DEFAULT_QSS, QssSettings
from safeaccess.server.errors import Conflict, InvalidRequest, NotFound
from safeaccess.server.store import auditlog, step_settings
from safeaccess.server.store.schema import (
    AuditorRow,
    DatasetRow,
    DPConfigRow,
    DPLedgerRow,
    EventRow,
    MembershipRow,
    NonceRow,
    ProjectRow,
    QssSettingsRow,
    ResearcherRow,
    utcnow,
)

if TYPE_CHECKING:
    from safeaccess.server.store.database import Database


# -- projects ------------------------------------------------------------------------------------


def add_project(store: Database, name: str, *, actor: str = "admin") -> None:
    """Create a project; Conflict if it exists."""
    try:
        with store.transaction() as s:
            s.add(ProjectRow(name=name))
            auditlog.append(s, "project_added", actor, {"project": name})
    except IntegrityError as exc:
        raise Conflict(f"project {name!r} already exists") from exc


def project_names(store: Database) -> list[str]:
    """Every project's name, sorted."""
    with store.transaction() as s:
        return list(s.scalars(select(ProjectRow.name).order_by(ProjectRow.name)))


def project_exists(store: Database, name: str) -> bool:
    """Whether project `name` exists."""
    with store.transaction() as s:
        return s.get(ProjectRow, name) is not None


# -- researchers and auditors --------------------------------------------------------------------


def add_researcher(
    store: Database,
    name: str,
    public_key_pem: str,
    fingerprint: str,
    projects: list[str],
    *,
    actor: str = "admin",
) -> None:
    """Register a researcher (or add projects to an existing one with the same key)."""
    with store.transaction() as s:
        for project in projects:
            if s.get(ProjectRow, project) is None:
                raise NotFound(
                    f"project {project!r} does not exist; add it with "
                    f"'safeaccess-server project add {project}'"
                )
        existing = s.get(ResearcherRow, name)
        if existing is None:
            s.add(ResearcherRow(name=name, public_key=public_key_pem, fingerprint=fingerprint))
            s.flush()
        elif existing.fingerprint != fingerprint:
            raise Conflict(
                f"researcher {name!r} is registered with another key ({existing.fingerprint})"
            )
        for project in projects:
            if s.get(MembershipRow, (name, project)) is None:
                s.add(MembershipRow(researcher=name, project=project))
        auditlog.append(
            s,
            "researcher_added",
            actor,
            {
                "researcher": name,
                "fingerprint": fingerprint,
                "public_key": public_key_pem,
                "projects": projects,
            },
        )


def change_researcher_key(
    store: Database,
    name: str,
    public_key_pem: str,
    new_fingerprint: str,
    *,
    server_id: str,
    signature: str | None = None,
    reason: str | None = None,
    actor: str = "admin",
) -> int:
    """Replace a researcher's key by a logged event; its log index.

    With `signature` (her old key's, over the rotation statement) it is her rotation; with
    `reason` instead it is the centre's revocation, which her client flags at her next
    connection. Her sequences signed with the old key accept no further reveal: the server
    checks every reveal's sequence signature against her key at that time."""
    if (signature is None) == (reason is None or not reason.strip()):
        raise InvalidRequest(
            "a key change is either her rotation (the old key's signature) or the centre's "
            "revocation (a reason): give exactly one"
        )
    with store.transaction() as s:
        row = s.get(ResearcherRow, name, with_for_update=True)
        if row is None:
            raise NotFound(f"researcher {name!r} is not registered")
        if row.fingerprint == new_fingerprint:
            raise Conflict(f"researcher {name!r} already has key {new_fingerprint}")
        data: dict[str, Any] = {
            "researcher": name,
            "old_fingerprint": row.fingerprint,
            "fingerprint": new_fingerprint,
            "public_key": public_key_pem,
        }
        if signature is not None:
            old_key = load_public_key(row.public_key.encode("ascii"))
            if not rotation_signed_by(
                old_key, signature, server_id, name, row.fingerprint, public_key_pem
            ):
                raise InvalidRequest(
                    f"the rotation is not signed by {name}'s current key "
                    f"({row.fingerprint}); she signs it with `safeaccess keys sign-rotation`, "
                    "or the centre revokes the key with a reason instead"
                )
            kind, data["signature"] = ROTATED, signature
        else:
            assert reason is not None
            kind, data["reason"] = REVOKED, reason.strip()
        old = row.fingerprint
        row.public_key, row.fingerprint = public_key_pem, new_fingerprint
        return auditlog.append(s, kind, actor, data, subject=old)


def key_status(store: Database, key_fingerprint: str) -> dict[str, Any]:
    """What the log says about a key: current, rotated or revoked (entry, reason), or
    unknown (never tells whose key it is)."""
    with store.transaction() as s:
        event = s.scalars(
            select(EventRow)
            .where(EventRow.subject == key_fingerprint, EventRow.kind.in_((ROTATED, REVOKED)))
            .order_by(EventRow.log_index)
        ).first()
        if event is not None:
            data = event.data
            return {
                "status": "rotated" if event.kind == ROTATED else "revoked",
                "entry": event.log_index,
                "reason": data.get("reason"),
                "replaced_by": data.get("fingerprint"),
            }
        current = s.scalars(
            select(ResearcherRow.name).where(ResearcherRow.fingerprint == key_fingerprint)
        ).first()
        if current is not None:
            return {"status": "current"}
        # Registered once, no longer current and never rotated or revoked: her account was
        # removed (she had no sequence), and her name may now be someone else's.
        for added in s.scalars(
            select(EventRow).where(EventRow.kind == "researcher_added").order_by(EventRow.log_index)
        ):
            if added.data.get("fingerprint") == key_fingerprint:
                removed = s.scalars(
                    select(EventRow)
                    .where(
                        EventRow.kind == "researcher_removed",
                        EventRow.log_index > added.log_index,
                    )
                    .order_by(EventRow.log_index)
                ).all()
                name = added.data.get("researcher")
                entry = next(
                    (r.log_index for r in removed if r.data.get("researcher") == name), None
                )
                return {"status": "removed", "entry": entry}
    return {"status": "unknown"}


def add_auditor(
    store: Database, name: str, public_key_pem: str, fingerprint: str, *, actor: str = "admin"
) -> None:
    """Register an auditor (her key reaches the audit endpoints only)."""
    with store.transaction() as s:
        existing = s.get(AuditorRow, name)
        if existing is not None:
            if existing.fingerprint == fingerprint:
                return
            raise Conflict(
                f"auditor {name!r} is registered with another key ({existing.fingerprint})"
            )
        s.add(AuditorRow(name=name, public_key=public_key_pem, fingerprint=fingerprint))
        auditlog.append(
            s,
            "auditor_added",
            actor,
            {"auditor": name, "fingerprint": fingerprint, "public_key": public_key_pem},
        )


def get_auditor(store: Database, name: str) -> AuditorRow | None:
    """An auditor by name."""
    with store.transaction() as s:
        return s.get(AuditorRow, name)


def get_researcher(store: Database, name: str) -> ResearcherRow | None:
    """A researcher by name (read on every request: a Core read, the row built from it)."""
    with store.one_statement() as conn:
        row = conn.execute(_RESEARCHER, {"name": name}).first()
    return None if row is None else ResearcherRow(**row._mapping)


def projects_of(store: Database, researcher: str) -> list[str]:
    """The projects a researcher belongs to, sorted (a Core read: every opening asks)."""
    with store.one_statement() as conn:
        return list(conn.scalars(_PROJECTS_OF, {"researcher": researcher}))


_PROJECTS_OF = (
    select(MembershipRow.project)
    .where(MembershipRow.researcher == bindparam("researcher"))
    .order_by(MembershipRow.project)
)


# -- datasets and their settings -----------------------------------------------------------------


def add_dataset(
    store: Database,
    *,
    name: str,
    version: int,
    project: str,
    path: str,
    sha256: str,
    rows: int,
    metadata: dict[str, Any],
    rules_path: str | None,
    qss: QssSettings = DEFAULT_QSS,
    actor: str = "admin",
) -> DatasetRow:
    """Register a dataset version with its auditor settings; Conflict if it exists."""
    try:
        with store.transaction() as s:
            if s.get(ProjectRow, project) is None:
                raise NotFound(f"project {project!r} does not exist")
            settings = s.get(QssSettingsRow, name)
            if settings is None:
                settings = QssSettingsRow(dataset=name)
                s.add(settings)
            settings.mode, settings.scope, settings.atom_cap = qss.mode, qss.scope, qss.atom_cap
            row = DatasetRow(
                name=name,
                version=version,
                project=project,
                path=path,
                sha256=sha256,
                rows=rows,
                dataset_metadata=metadata,
                rules_path=rules_path,
            )
            s.add(row)
            s.flush()
            auditlog.append(
                s,
                "dataset_added",
                actor,
                {
                    "dataset": name,
                    "version": version,
                    "project": project,
                    "sha256": sha256,
                    "rows": rows,
                    "qss": qss.model_dump(mode="json"),
                },
            )
            return row
    except IntegrityError as exc:
        raise Conflict(f"dataset {name} version {version} already exists") from exc


def qss_settings(store: Database, name: str) -> QssSettings:
    """The auditor settings of dataset `name` (the defaults if none were recorded)."""
    scoped = step_settings.scoped_by_name(store, name)
    if scoped is not None:
        return scoped.qss
    with store.one_statement() as conn:
        row = conn.execute(_QSS_SETTINGS, {"name": name}).first()
    if row is None:
        return DEFAULT_QSS
    return QssSettings(mode=row.mode, scope=row.scope, atom_cap=row.atom_cap)


def resolve_qss_settings(store: Database, name: str, requested: QssSettings | None) -> QssSettings:
    """The settings a new version of `name` gets: those asked for, else the current ones.
    The scope of an existing dataset cannot change: states are kept per scope, so a new scope
    would start from nothing and forget every release so far."""
    with store.transaction() as s:
        exists = s.get(QssSettingsRow, name) is not None
    current = qss_settings(store, name)
    if requested is None:
        return current
    if exists and requested.scope != current.scope:
        raise InvalidRequest(
            f"dataset {name!r} is audited with scope {current.scope!r}; the scope cannot "
            "change between versions (a new scope would start without the releases so far)"
        )
    return requested


def next_dataset_version(store: Database, name: str) -> int:
    """The version number a new registration of `name` gets."""
    with store.transaction() as s:
        current = s.scalar(select(func.max(DatasetRow.version)).where(DatasetRow.name == name))
        return (current or 0) + 1


def get_dataset(store: Database, dataset_id: int) -> DatasetRow:
    """A dataset version by id (read once, then from memory: versions are immutable)."""
    row = store.dataset_cache.get(dataset_id)
    if row is not None:
        return row
    with store.transaction() as s:
        row = s.get(DatasetRow, dataset_id)
        if row is None:
            raise NotFound(f"dataset id {dataset_id} does not exist")
    store.dataset_cache[dataset_id] = row
    return row


def find_dataset(store: Database, name: str, version: int | None = None) -> DatasetRow | None:
    """A dataset by name: the given version, else the newest (a Core read, the row built from
    it, as in `get_researcher`: every opening asks)."""
    with store.one_statement() as conn:
        if version is None:
            found = conn.execute(_NEWEST_DATASET, {"name": name}).first()
        else:
            found = conn.execute(_DATASET_VERSION, {"name": name, "version": version}).first()
    if found is None:
        return None
    row = DatasetRow(**found._mapping)
    # As in `get_dataset`: a version never changes, and the step that found it needs it again.
    store.dataset_cache[row.id] = row
    return row


def dataset_versions(store: Database, name: str) -> list[DatasetRow]:
    """Every registered version of dataset `name`, oldest first."""
    with store.transaction() as s:
        query = select(DatasetRow).where(DatasetRow.name == name)
        return list(s.scalars(query.order_by(DatasetRow.version)))


def version_ids(store: Database, name: str) -> list[int]:
    """The ids of every registered version of dataset `name`, oldest first: as the open
    settings scope read them with the dataset's settings, if it did (`step_settings.py`), else
    a Core read of one column (a step needs them all, and the full rows only of versions it has
    not seen)."""
    scoped = step_settings.scoped_by_name(store, name)
    if scoped is not None:
        return list(scoped.version_ids)
    with store.one_statement() as conn:
        return [int(i) for i in conn.execute(_VERSION_IDS, {"name": name}).scalars()]


def all_datasets(store: Database) -> list[DatasetRow]:
    """Every registered dataset version, by name then version."""
    with store.transaction() as s:
        query = select(DatasetRow).order_by(DatasetRow.name, DatasetRow.version)
        return list(s.scalars(query))


def datasets_for(store: Database, researcher: str) -> list[DatasetRow]:
    """Every dataset version of the projects the researcher belongs to."""
    with store.transaction() as s:
        query = (
            select(DatasetRow)
            .join(MembershipRow, MembershipRow.project == DatasetRow.project)
            .where(MembershipRow.researcher == researcher)
            .order_by(DatasetRow.name, DatasetRow.version)
        )
        return list(s.scalars(query))


def dataset_known(s: Session, name: str) -> bool:
    """Whether any version of dataset `name` is registered."""
    return bool(s.scalar(select(func.count()).where(DatasetRow.name == name)))


def rules_path(conn: Connection, dataset_id: int) -> str | None:
    """The rule-set file recorded on a dataset version (None: the default rules)."""
    return conn.execute(_RULES_PATH, {"dataset_id": dataset_id}).scalar_one_or_none()


# Built once: the reads on every step's path (statement construction costs more than the read).
_DATASETS: Table = DatasetRow.__table__  # type: ignore[assignment]
_NEWEST_DATASET = (
    select(_DATASETS)
    .where(_DATASETS.c.name == bindparam("name"))
    .order_by(_DATASETS.c.version.desc())
    .limit(1)
)
_DATASET_VERSION = select(_DATASETS).where(
    _DATASETS.c.name == bindparam("name"),
    _DATASETS.c.version == bindparam("version"),
)
_VERSION_IDS = (
    select(_DATASETS.c.id)
    .where(_DATASETS.c.name == bindparam("name"))
    .order_by(_DATASETS.c.version)
)
_RULES_PATH = select(_DATASETS.c.rules_path).where(_DATASETS.c.id == bindparam("dataset_id"))
_QSS_TABLE: Table = QssSettingsRow.__table__  # type: ignore[assignment]
_QSS_SETTINGS = select(_QSS_TABLE.c.mode, _QSS_TABLE.c.scope, _QSS_TABLE.c.atom_cap).where(
    _QSS_TABLE.c.dataset == bindparam("name")
)
_DP_TABLE: Table = DPConfigRow.__table__  # type: ignore[assignment]
_DP_CONFIG = select(_DP_TABLE.c.config).where(_DP_TABLE.c.dataset == bindparam("name"))


def set_rules_path(s: Session, dataset_id: int, path: str) -> None:
    """Record a dataset version's rule-set file (relative to the data directory)."""
    stored = s.get(DatasetRow, dataset_id)
    if stored is None:
        raise NotFound(f"dataset id {dataset_id} does not exist")
    stored.rules_path = path


def get_dp_config(store: Database, dataset: str) -> dict[str, Any] | None:
    """The DP configuration of dataset `dataset` (None: DP is off)."""
    scoped = step_settings.scoped_by_name(store, dataset)
    if scoped is not None:
        return None if scoped.dp_config is None else dict(scoped.dp_config)
    with store.one_statement() as conn:
        config = conn.execute(_DP_CONFIG, {"name": dataset}).scalar_one_or_none()
    return dict(config) if config is not None else None


def set_dp_config(
    store: Database, dataset: str, config: dict[str, Any], *, actor: str = "admin"
) -> None:
    """Enable or change DP on every version of `dataset`. The scope cannot change once a
    ledger holds a charge: the new scope's fresh ledgers would forget what was spent."""
    with store.transaction() as s:
        if not dataset_known(s, dataset):
            raise NotFound(f"dataset {dataset!r} does not exist; add it with 'dataset add'")
        row = s.get(DPConfigRow, dataset)
        if row is not None and row.config.get("scope") != config.get("scope"):
            charged = s.scalar(
                select(func.count())
                .where(DPLedgerRow.dataset == dataset)
                .where(DPLedgerRow.releases > 0)
            )
            if charged:
                raise Conflict(
                    f"dataset {dataset!r} already has DP releases charged per "
                    f"{row.config.get('scope')}; its scope cannot change (the new scope's "
                    "ledgers would start from nothing)",
                    code="dp_scope_fixed",
                )
        if row is None:
            s.add(DPConfigRow(dataset=dataset, config=config, updated_at=utcnow()))
        else:
            row.config = config
            row.updated_at = utcnow()
        auditlog.append(s, "dp_configured", actor, {"dataset": dataset, "dp": config})


# -- request nonces ------------------------------------------------------------------------------


def remember_nonce(store: Database, keyid: str, nonce: str, expires_at: int) -> bool:
    """Record a request nonce; False if it is already known and not expired (a replay)."""
    now = int(time.time())
    # One statement per request: the insert takes the place of an expired row with the same
    # key (as if it had been deleted first) and does nothing to a live one (a replay). Expired
    # rows of other nonces are deleted at most once a minute per process, not per request:
    # they only take space, since an expired row never refuses anything.
    # Each statement stands alone (`one_statement`: no BEGIN and COMMIT on PostgreSQL).
    with store.one_statement() as conn:
        if now >= store.nonces_purged_at + _NONCE_PURGE_SECONDS:
            conn.execute(_EXPIRE_NONCES, {"now": now})
            store.nonces_purged_at = now
        upsert = _UPSERT_NONCE[conn.dialect.name]
        written = conn.execute(upsert, {"k": keyid, "n": nonce, "e": expires_at, "now": now})
        # A row comes back when the nonce was inserted or took an expired row's place (the
        # affected-row count is not reported for an insert by every driver).
        return written.first() is not None


_NONCE_PURGE_SECONDS = 60
_NONCES: Table = NonceRow.__table__  # type: ignore[assignment]
_EXPIRE_NONCES = delete(_NONCES).where(_NONCES.c.expires_at < bindparam("now"))


def _upsert_nonce(insert_of: Any) -> Any:
    statement = insert_of(_NONCES).values(
        keyid=bindparam("k"), nonce=bindparam("n"), expires_at=bindparam("e")
    )
    return statement.on_conflict_do_update(
        index_elements=[_NONCES.c.keyid, _NONCES.c.nonce],
        set_={"expires_at": statement.excluded.expires_at},
        where=_NONCES.c.expires_at < bindparam("now"),
    ).returning(_NONCES.c.keyid)


# Built once per dialect (both spell the upsert alike): this runs for every signed request.
_UPSERT_NONCE = {
    "sqlite": _upsert_nonce(sqlite_insert),
    "postgresql": _upsert_nonce(postgresql_insert),
}
_RESEARCHERS: Table = ResearcherRow.__table__  # type: ignore[assignment]
_RESEARCHER = select(_RESEARCHERS).where(_RESEARCHERS.c.name == bindparam("name"))
