"""Persistence: every state change and its result in one database transaction.

The store is the only module that writes to the database. Each public method is one transaction:
a step's outcome (state, output, decision, ruleset hash) and the sequence's new state and the
event row commit together or not at all. A step recorded as `running` whose result never committed
(a crash while the sandbox ran) is re-run when the researcher retries the same reveal.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, create_engine, delete, event, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from safeaccess.client.keyrotation import REVOKED, ROTATED, rotation_signed_by
from safeaccess.client.keys import load_public_key
from safeaccess.server import audit_records, auditlog
from safeaccess.server.errors import Conflict, InvalidRequest, NotFound

# The outcome types moved to `safeaccess.server.outcome`; re-exported here until the layout
# change's last step (other branches still import them from the store).
from safeaccess.server.outcome import DPCharge as DPCharge
from safeaccess.server.outcome import DPLedgerState as DPLedgerState
from safeaccess.server.outcome import QssCommit as QssCommit
from safeaccess.server.outcome import QssPointer as QssPointer
from safeaccess.server.outcome import StepOutcome as StepOutcome
from safeaccess.server.qss_settings import DEFAULT_QSS, QssSettings
from safeaccess.server.states import (
    SequenceState,
    StepState,
    check_sequence_transition,
    check_step_transition,
    sequence_state_after_step,
)
from safeaccess.server.store import migrate
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
    QssStateRow,
    ResearcherRow,
    SequenceRow,
    StepRow,
    utcnow,
)

#: The error code recorded on step 1 of a sequence whose opening an output checker rejected.
OPENING_REJECTED = "opening_rejected"


def make_engine(url: str) -> Engine:
    """The SQLAlchemy engine of a store URL (SQLite gets WAL, foreign keys and full sync)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            # WAL lets readers proceed while one writer commits; foreign keys are off by default.
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


class Store:
    """Transactions over the safeaccess schema."""

    def __init__(self, url: str):
        self.engine = make_engine(url)
        try:
            migrate.ensure(self.engine)
        except migrate.SchemaBehind:
            self.engine.dispose()
            raise
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        with self.transaction() as s:
            auditlog.ensure_head(s)
        self._logged_rulesets: set[str] = set()
        # A registered dataset version never changes (a new version is a new row), so rows read
        # once are kept: every step needs its dataset several times.
        self._datasets: dict[int, DatasetRow] = {}

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One transaction: commits on success, rolls back on any exception."""
        with self._sessions.begin() as session:
            yield session

    # -- events ---------------------------------------------------------------------------------

    @staticmethod
    def _event(
        session: Session,
        kind: str,
        actor: str,
        data: dict[str, Any],
        sequence_id: str | None = None,
        step_index: int | None = None,
        *,
        subject: str | None = None,
    ) -> int:
        """Append an audit-log record in this transaction; its log index."""
        return auditlog.append(
            session,
            kind,
            actor,
            data,
            sequence_id=sequence_id,
            step_index=step_index,
            subject=subject,
        )

    def events(self, sequence_id: str | None = None) -> list[EventRow]:
        with self.transaction() as s:
            query = select(EventRow).order_by(EventRow.log_index)
            if sequence_id is not None:
                query = query.where(EventRow.sequence_id == sequence_id)
            return list(s.scalars(query))

    def last_event(self, kind: str) -> EventRow | None:
        with self.transaction() as s:
            query = select(EventRow).where(EventRow.kind == kind)
            return s.scalars(query.order_by(EventRow.log_index.desc()).limit(1)).first()

    def log_event(self, kind: str, actor: str, data: dict[str, Any]) -> int:
        """An administrative record on its own (configuration changes, auditors, ...)."""
        with self.transaction() as s:
            return self._event(s, kind, actor, data)

    # -- projects, researchers, datasets --------------------------------------------------------

    def add_project(self, name: str, *, actor: str = "admin") -> None:
        try:
            with self.transaction() as s:
                s.add(ProjectRow(name=name))
                self._event(s, "project_added", actor, {"project": name})
        except IntegrityError as exc:
            raise Conflict(f"project {name!r} already exists") from exc

    def project_names(self) -> list[str]:
        with self.transaction() as s:
            return list(s.scalars(select(ProjectRow.name).order_by(ProjectRow.name)))

    def project_exists(self, name: str) -> bool:
        with self.transaction() as s:
            return s.get(ProjectRow, name) is not None

    def add_researcher(
        self,
        name: str,
        public_key_pem: str,
        fingerprint: str,
        projects: list[str],
        *,
        actor: str = "admin",
    ) -> None:
        """Register a researcher (or add projects to an existing one with the same key)."""
        with self.transaction() as s:
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
            self._event(
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
        self,
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
        with self.transaction() as s:
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
            return self._event(s, kind, actor, data, subject=old)

    def key_status(self, key_fingerprint: str) -> dict[str, Any]:
        """What the log says about a key: current, rotated or revoked (entry, reason), or
        unknown (never tells whose key it is)."""
        with self.transaction() as s:
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
                select(EventRow)
                .where(EventRow.kind == "researcher_added")
                .order_by(EventRow.log_index)
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
        self, name: str, public_key_pem: str, fingerprint: str, *, actor: str = "admin"
    ) -> None:
        """Register an auditor (her key reaches the audit endpoints only)."""
        with self.transaction() as s:
            existing = s.get(AuditorRow, name)
            if existing is not None:
                if existing.fingerprint == fingerprint:
                    return
                raise Conflict(
                    f"auditor {name!r} is registered with another key ({existing.fingerprint})"
                )
            s.add(AuditorRow(name=name, public_key=public_key_pem, fingerprint=fingerprint))
            self._event(
                s,
                "auditor_added",
                actor,
                {"auditor": name, "fingerprint": fingerprint, "public_key": public_key_pem},
            )

    def get_auditor(self, name: str) -> AuditorRow | None:
        with self.transaction() as s:
            return s.get(AuditorRow, name)

    def get_researcher(self, name: str) -> ResearcherRow | None:
        with self.transaction() as s:
            return s.get(ResearcherRow, name)

    def projects_of(self, researcher: str) -> list[str]:
        with self.transaction() as s:
            rows = s.scalars(
                select(MembershipRow.project)
                .where(MembershipRow.researcher == researcher)
                .order_by(MembershipRow.project)
            )
            return list(rows)

    def add_dataset(
        self,
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
        try:
            with self.transaction() as s:
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
                self._event(
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

    def qss_settings(self, name: str) -> QssSettings:
        """The auditor settings of dataset `name` (the defaults if none were recorded)."""
        with self.transaction() as s:
            row = s.get(QssSettingsRow, name)
            if row is None:
                return DEFAULT_QSS
            return QssSettings(mode=row.mode, scope=row.scope, atom_cap=row.atom_cap)

    def resolve_qss_settings(self, name: str, requested: QssSettings | None) -> QssSettings:
        """The settings a new version of `name` gets: those asked for, else the current ones.
        The scope of an existing dataset cannot change: states are kept per scope, so a new scope
        would start from nothing and forget every release so far."""
        with self.transaction() as s:
            exists = s.get(QssSettingsRow, name) is not None
        current = self.qss_settings(name)
        if requested is None:
            return current
        if exists and requested.scope != current.scope:
            raise InvalidRequest(
                f"dataset {name!r} is audited with scope {current.scope!r}; the scope cannot "
                "change between versions (a new scope would start without the releases so far)"
            )
        return requested

    def qss_pointer(self, scope: str) -> QssPointer | None:
        with self.transaction() as s:
            row = s.get(QssStateRow, scope)
            if row is None:
                return None
            return QssPointer(digest=row.digest, n_records=row.n_records, admitted=row.admitted)

    @staticmethod
    def _move_qss_pointer(s: Session, commit: QssCommit) -> None:
        # FOR UPDATE: on PostgreSQL a second replica admitting against the same scope waits here
        # and then sees the moved pointer; on SQLite the write lock of the transaction does it.
        row = s.scalars(
            select(QssStateRow).where(QssStateRow.scope == commit.scope).with_for_update()
        ).first()
        current = None if row is None else row.digest
        if current != commit.base:
            raise Conflict(
                "the query-set audit state changed while this step was checked",
                code="qss_state_changed",
            )
        if row is None:
            s.add(
                QssStateRow(
                    scope=commit.scope,
                    digest=commit.digest,
                    n_records=commit.n_records,
                    admitted=1,
                    updated_at=utcnow(),
                )
            )
        else:
            row.digest = commit.digest
            row.n_records = commit.n_records
            row.admitted = row.admitted + 1
            row.updated_at = utcnow()

    def next_dataset_version(self, name: str) -> int:
        with self.transaction() as s:
            current = s.scalar(select(func.max(DatasetRow.version)).where(DatasetRow.name == name))
            return (current or 0) + 1

    def get_dataset(self, dataset_id: int) -> DatasetRow:
        """A dataset version by id (read once, then from memory: versions are immutable)."""
        row = self._datasets.get(dataset_id)
        if row is not None:
            return row
        with self.transaction() as s:
            row = s.get(DatasetRow, dataset_id)
            if row is None:
                raise NotFound(f"dataset id {dataset_id} does not exist")
        self._datasets[dataset_id] = row
        return row

    def find_dataset(self, name: str, version: int | None = None) -> DatasetRow | None:
        """A dataset by name: the given version, else the newest."""
        with self.transaction() as s:
            query = select(DatasetRow).where(DatasetRow.name == name)
            if version is not None:
                query = query.where(DatasetRow.version == version)
            return s.scalars(query.order_by(DatasetRow.version.desc()).limit(1)).first()

    def dataset_versions(self, name: str) -> list[DatasetRow]:
        """Every registered version of dataset `name`, oldest first."""
        with self.transaction() as s:
            query = select(DatasetRow).where(DatasetRow.name == name)
            return list(s.scalars(query.order_by(DatasetRow.version)))

    def datasets_for(self, researcher: str) -> list[DatasetRow]:
        """Every dataset version of the projects the researcher belongs to."""
        with self.transaction() as s:
            query = (
                select(DatasetRow)
                .join(MembershipRow, MembershipRow.project == DatasetRow.project)
                .where(MembershipRow.researcher == researcher)
                .order_by(DatasetRow.name, DatasetRow.version)
            )
            return list(s.scalars(query))

    # -- request nonces -------------------------------------------------------------------------

    def remember_nonce(self, keyid: str, nonce: str, expires_at: int) -> bool:
        """Record a request nonce; False if it is already known (a replay)."""
        try:
            with self.transaction() as s:
                s.execute(delete(NonceRow).where(NonceRow.expires_at < int(time.time())))
                s.add(NonceRow(keyid=keyid, nonce=nonce, expires_at=expires_at))
            return True
        except IntegrityError:
            return False

    # -- sequences and steps --------------------------------------------------------------------

    def create_sequence(
        self,
        *,
        sequence_id: str,
        researcher: str,
        project: str,
        dataset_id: int,
        header: bytes,
        header_hash: str,
        nonce: str,
        signature: bytes,
        endorsements: list[Any],
        verifier_state: dict[str, Any],
        first_step: StepRow,
        event_data: dict[str, Any],
        awaiting_approval: bool = False,
    ) -> tuple[SequenceRow, StepRow]:
        """Accept a header and start its step 1 (state `running`) in one transaction; with
        `awaiting_approval` (past the withhold budget) the sequence waits for an output checker
        and step 1 is `pending`, not run."""
        seq_state, step_state = (
            (SequenceState.AWAITING_APPROVAL, StepState.PENDING)
            if awaiting_approval
            else (SequenceState.RUNNING, StepState.RUNNING)
        )
        check_sequence_transition(SequenceState.OPENED, seq_state)
        try:
            with self.transaction() as s:
                seq = SequenceRow(
                    id=sequence_id,
                    researcher=researcher,
                    project=project,
                    dataset_id=dataset_id,
                    header=header,
                    header_hash=header_hash,
                    nonce=nonce,
                    signature=signature,
                    endorsements=endorsements,
                    state=seq_state.value,
                    current_index=1,
                    verifier_state=verifier_state,
                    version=1,
                )
                s.add(seq)
                s.flush()
                first_step.sequence_id = sequence_id
                first_step.state = step_state.value
                s.add(first_step)
                s.flush()
                opened = {k: v for k, v in event_data.items() if k != "reveal"}
                auditlog.append_many(
                    s,
                    [
                        auditlog.Entry("sequence_opened", researcher, opened, sequence_id),
                        *self._reveal_entries(
                            researcher, event_data.get("reveal", {}), sequence_id, 1
                        ),
                    ],
                )
                return seq, first_step
        except IntegrityError as exc:
            with self.transaction() as s:
                prior = s.scalars(
                    select(SequenceRow.id).where(SequenceRow.header_hash == header_hash)
                ).first()
            where = f" (sequence {prior})" if prior else ""
            raise Conflict(
                f"this sequence header was already accepted{where}; a header is usable once — "
                "seal a new sequence",
                code="header_replayed",
            ) from exc

    def get_sequence(self, sequence_id: str) -> SequenceRow | None:
        with self.transaction() as s:
            return s.get(SequenceRow, sequence_id)

    def list_sequences(self, researcher: str) -> list[SequenceRow]:
        with self.transaction() as s:
            query = (
                select(SequenceRow)
                .where(SequenceRow.researcher == researcher)
                .order_by(SequenceRow.created_at, SequenceRow.id)
            )
            return list(s.scalars(query))

    def steps(self, sequence_id: str) -> list[StepRow]:
        with self.transaction() as s:
            query = (
                select(StepRow).where(StepRow.sequence_id == sequence_id).order_by(StepRow.index)
            )
            return list(s.scalars(query))

    def get_step(self, sequence_id: str, index: int) -> StepRow | None:
        with self.transaction() as s:
            return s.scalars(
                select(StepRow).where(StepRow.sequence_id == sequence_id, StepRow.index == index)
            ).first()

    def _update_sequence(
        self, s: Session, seq: SequenceRow, target: SequenceState, **values: Any
    ) -> None:
        check_sequence_transition(SequenceState(seq.state), target)
        result = s.execute(
            update(SequenceRow)
            .where(SequenceRow.id == seq.id, SequenceRow.version == seq.version)
            .values(state=target.value, version=seq.version + 1, updated_at=utcnow(), **values)
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            raise Conflict(
                "the sequence changed while this request was handled; retry the request",
                code="concurrent_update",
            )

    def begin_step(
        self,
        sequence_id: str,
        *,
        expected_version: int,
        step: StepRow,
        verifier_state: dict[str, Any],
        event_data: dict[str, Any],
    ) -> StepRow:
        """Accept reveal `step.index` of a released sequence: the step starts `running`."""
        with self.transaction() as s:
            seq = s.get(SequenceRow, sequence_id)
            if seq is None:
                raise NotFound(f"sequence {sequence_id} does not exist")
            if seq.version != expected_version:
                raise Conflict(
                    "the sequence changed while this request was handled; retry the request",
                    code="concurrent_update",
                )
            if seq.state != SequenceState.RELEASED or step.index != seq.current_index + 1:
                raise Conflict(
                    f"step {step.index} cannot be revealed while the sequence is {seq.state} at "
                    f"step {seq.current_index}",
                    code="not_released",
                )
            self._update_sequence(
                s,
                seq,
                SequenceState.RUNNING,
                current_index=step.index,
                verifier_state=verifier_state,
            )
            step.sequence_id = sequence_id
            step.state = StepState.RUNNING.value
            s.add(step)
            s.flush()
            auditlog.append_many(
                s, self._reveal_entries(seq.researcher, event_data, sequence_id, step.index)
            )
            return step

    def settle_step(
        self,
        sequence_id: str,
        index: int,
        outcome: StepOutcome,
        event_data: dict[str, Any],
        *,
        qss: QssCommit | None = None,
    ) -> tuple[SequenceRow, StepRow]:
        """Record a computed step's outcome and move the sequence on, in one transaction; with
        `qss`, point the scope at the auditor state that admitted this step in the same one."""
        try:
            return self._settle_step(sequence_id, index, outcome, event_data, qss)
        except IntegrityError as exc:
            # Two replicas created the scope's first pointer at once: the later one re-admits.
            raise Conflict(
                "the query-set audit state changed while this step was checked",
                code="qss_state_changed",
            ) from exc

    def _settle_step(
        self,
        sequence_id: str,
        index: int,
        outcome: StepOutcome,
        event_data: dict[str, Any],
        qss: QssCommit | None,
    ) -> tuple[SequenceRow, StepRow]:
        """Record a computed step's outcome and move the sequence on, in one transaction (with
        the DP ledger's charge when the step releases a DP answer: no answer without its charge,
        no charge without its answer)."""
        with self.transaction() as s:
            if outcome.dp_charge is not None:
                self._charge_ledger(s, outcome.dp_charge)
            seq = s.get(SequenceRow, sequence_id)
            step = s.scalars(
                select(StepRow)
                .where(StepRow.sequence_id == sequence_id, StepRow.index == index)
                .with_for_update()
            ).first()
            if seq is None or step is None:
                raise NotFound(f"step {index} of sequence {sequence_id} does not exist")
            if seq.current_index != index or seq.state != SequenceState.RUNNING:
                raise Conflict(
                    f"step {index} is no longer running (sequence is {seq.state})",
                    code="concurrent_update",
                )
            check_step_transition(StepState(step.state), outcome.state)
            target = sequence_state_after_step(outcome.state, last=step.last)
            if qss is not None:
                self._move_qss_pointer(s, qss)
            self._update_sequence(s, seq, target)
            step.state = outcome.state.value
            step.kind = outcome.kind
            step.output = outcome.output
            step.public_output = outcome.public_output
            step.output_hash = outcome.output_hash
            step.decision = outcome.decision
            step.ruleset_hash = outcome.ruleset_hash
            step.error_code = outcome.error_code
            step.error_message = outcome.error_message
            step.backend = outcome.backend
            step.wall_seconds = outcome.wall_seconds
            step.updated_at = utcnow()
            self._settle_events(s, step, outcome, event_data, sequence_id, index)
            s.flush()
            s.refresh(seq)
            return seq, step

    # -- differential privacy -------------------------------------------------------------------

    @staticmethod
    def _charge_ledger(s: Session, charge: DPCharge) -> None:
        row = s.get(DPLedgerRow, charge.key, with_for_update=True)
        if row is None:
            if charge.version != 0:
                raise Conflict("the privacy ledger changed; retry", code="concurrent_update")
            s.add(
                DPLedgerRow(
                    key=charge.key,
                    dataset=charge.dataset,
                    scope=charge.scope,
                    owner=charge.owner,
                    spent=charge.spent_after,
                    releases=charge.releases_after,
                    version=1,
                    updated_at=utcnow(),
                )
            )
            try:
                s.flush()
            except IntegrityError as exc:
                # Another process made the ledger's first row meanwhile (it did not exist when
                # this transaction looked): the same stale charge as a changed version.
                raise Conflict(
                    "the privacy ledger changed while this step ran; retry the same reveal",
                    code="concurrent_update",
                ) from exc
            return
        result = s.execute(
            update(DPLedgerRow)
            .where(DPLedgerRow.key == charge.key, DPLedgerRow.version == charge.version)
            .values(
                spent=charge.spent_after,
                releases=charge.releases_after,
                version=charge.version + 1,
                updated_at=utcnow(),
            )
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            raise Conflict(
                "the privacy ledger changed while this step ran; retry the same reveal",
                code="concurrent_update",
            )

    def charge_public_ledger(
        self, charge: DPCharge, *, event_data: dict[str, Any], actor: str = "admin"
    ) -> None:
        """Charge a dataset's public ledger (a mock) and record it, in one transaction."""
        with self.transaction() as s:
            self._charge_ledger(s, charge)
            kind = "mock_published" if event_data.get("published") else "mock_generated"
            self._event(s, kind, actor, {"dataset": charge.dataset, **event_data})

    def dp_ledger(self, key: str) -> DPLedgerState:
        with self.transaction() as s:
            row = s.get(DPLedgerRow, key)
            if row is None:
                return DPLedgerState()
            return DPLedgerState(spent=row.spent, releases=row.releases, version=row.version)

    def dp_ledgers(self, dataset: str) -> list[DPLedgerRow]:
        with self.transaction() as s:
            query = select(DPLedgerRow).where(DPLedgerRow.dataset == dataset)
            return list(s.scalars(query.order_by(DPLedgerRow.key)))

    def get_dp_config(self, dataset: str) -> dict[str, Any] | None:
        with self.transaction() as s:
            row = s.get(DPConfigRow, dataset)
            return dict(row.config) if row is not None else None

    def set_dp_config(self, dataset: str, config: dict[str, Any], *, actor: str = "admin") -> None:
        """Enable or change DP on every version of `dataset`. The scope cannot change once a
        ledger holds a charge: the new scope's fresh ledgers would forget what was spent."""
        with self.transaction() as s:
            known = s.scalar(select(func.count()).where(DatasetRow.name == dataset))
            if not known:
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
            self._event(s, "dp_configured", actor, {"dataset": dataset, "dp": config})

    def record_script_run(
        self, sequence_id: str, index: int, outcome: StepOutcome, event_data: dict[str, Any]
    ) -> None:
        """Store a background script run's result on its step (for output checkers), leaving
        everything the researcher sees as it was: state, times, the sequence row, the rule-set
        hash fixed when the step was queued."""
        with self.transaction() as s:
            step = s.scalars(
                select(StepRow)
                .where(StepRow.sequence_id == sequence_id, StepRow.index == index)
                .with_for_update()
            ).first()
            if step is None:
                raise NotFound(f"step {index} of sequence {sequence_id} does not exist")
            step.output = outcome.output
            step.public_output = outcome.public_output
            step.output_hash = outcome.output_hash
            step.decision = outcome.decision
            step.error_code = outcome.error_code
            step.error_message = outcome.error_message
            step.backend = outcome.backend
            step.wall_seconds = outcome.wall_seconds
            # Not appended now: the log's size is in every checkpoint a researcher can fetch, so
            # an entry at the run's end would time her script on the real data. The record
            # waits for the first checker action on the step (`append_script_run`), whose time
            # is the checker's. A step decided while its script ran never gets it in the log.
            if step.state == StepState.REVIEW:
                step.run_event = event_data

    @staticmethod
    def _reveal_entries(
        researcher: str, data: dict[str, Any], sequence_id: str, index: int
    ) -> list[auditlog.Entry]:
        """A reveal and the start of its run: `data` holds the reveal's fields and, under "run",
        what the run starts with (backend, limits, runner version)."""
        reveal = {k: v for k, v in data.items() if k != "run"}
        return [
            auditlog.Entry("step_revealed", researcher, reveal, sequence_id, index),
            auditlog.Entry("run_started", "server", data.get("run", {}), sequence_id, index),
        ]

    def _settle_events(
        self,
        s: Session,
        step: StepRow,
        outcome: StepOutcome,
        event_data: dict[str, Any],
        sequence_id: str,
        index: int,
    ) -> None:
        """The run's end, the checks with the facts they used (and the rule set, the first time
        it decides anything), and the outcome with a salted commitment to the output."""
        records = audit_records.settle_records(step, outcome, event_data)
        entries = []
        ruleset = records.ruleset
        if ruleset is not None and not self._ruleset_logged(s, ruleset["sha256"]):
            entries.append(auditlog.Entry("ruleset", "server", ruleset, subject=ruleset["sha256"]))
        entries += [
            auditlog.Entry("run_finished", "server", records.run, sequence_id, index),
            auditlog.Entry("checks", "server", records.checks, sequence_id, index),
            auditlog.Entry(
                f"step_{outcome.state.value}", "server", records.outcome, sequence_id, index
            ),
        ]
        step.log_index = auditlog.append_many(s, entries)[-1]

    def _ruleset_logged(self, s: Session, digest: str) -> bool:
        # Only a committed fact is cached (the log is append-only), never an absence.
        if digest in self._logged_rulesets:
            return True
        if auditlog.logged(s, "ruleset", digest):
            self._logged_rulesets.add(digest)
            return True
        return False

    # -- the withhold budget ------------------------------------------------------------------

    def withholds_since(
        self, researcher: str, dataset_name: str, since: datetime
    ) -> tuple[int, int]:
        """(steps withheld, sequences still open) for a researcher on every version of a
        dataset: withholds updated at or after `since`; rejected openings are not withholds of
        data and do not count."""
        mine = (SequenceRow.researcher == researcher) & SequenceRow.dataset_id.in_(
            select(DatasetRow.id).where(DatasetRow.name == dataset_name).scalar_subquery()
        )
        withheld_q = (
            select(func.count())
            .select_from(StepRow)
            .join(SequenceRow, SequenceRow.id == StepRow.sequence_id)
            .where(
                mine,
                StepRow.state == StepState.WITHHELD.value,
                StepRow.updated_at >= since,
                (StepRow.error_code.is_(None)) | (StepRow.error_code != OPENING_REJECTED),
            )
            .scalar_subquery()
        )
        # Each open sequence can still end in one withhold (a withhold aborts it): opened while
        # the budget lasted, it must not be a way to collect withholds beyond it.
        open_q = (
            select(func.count())
            .select_from(SequenceRow)
            .where(
                mine,
                SequenceRow.state.not_in(
                    (SequenceState.FINISHED.value, SequenceState.ABORTED.value)
                ),
            )
            .scalar_subquery()
        )
        with self.transaction() as s:  # one round trip for both counts
            withheld, open_sequences = s.execute(select(withheld_q, open_q)).one()
            return int(withheld or 0), int(open_sequences or 0)

    def openings_waiting(self) -> list[tuple[SequenceRow, DatasetRow]]:
        """Sequences waiting for an output checker to approve their opening, oldest first."""
        with self.transaction() as s:
            query = (
                select(SequenceRow, DatasetRow)
                .join(DatasetRow, DatasetRow.id == SequenceRow.dataset_id)
                .where(SequenceRow.state == SequenceState.AWAITING_APPROVAL.value)
                .order_by(SequenceRow.created_at, SequenceRow.id)
            )
            return [(row[0], row[1]) for row in s.execute(query)]

    @staticmethod
    def append_script_run(session: Session, step: StepRow) -> None:
        """Append a script step's held `script_run_finished` record, once, in the transaction
        of a checker's first action on the step (viewing it, approving or rejecting it)."""
        if step.run_event is None:
            return
        auditlog.append(
            session,
            "script_run_finished",
            "server",
            step.run_event,
            sequence_id=step.sequence_id,
            step_index=step.index,
        )
        step.run_event = None

    def decide_opening(
        self,
        sequence_id: str,
        *,
        approve: bool,
        reviewer: str,
        note: str,
        event_data: dict[str, Any],
    ) -> tuple[SequenceRow, StepRow]:
        """Approve (step 1 becomes `running`, run on the researcher's next reveal) or reject (the
        sequence is aborted) a sequence waiting past the withhold budget."""
        if not reviewer:
            raise InvalidRequest("a decision needs the output checker's name")
        with self.transaction() as s:
            seq = s.get(SequenceRow, sequence_id)
            step = s.scalars(
                select(StepRow).where(StepRow.sequence_id == sequence_id, StepRow.index == 1)
            ).first()
            if seq is None or step is None:
                raise NotFound(f"sequence {sequence_id} does not exist")
            if seq.state != SequenceState.AWAITING_APPROVAL:
                raise Conflict(f"sequence {sequence_id} is {seq.state}, not awaiting approval")
            target = StepState.RUNNING if approve else StepState.WITHHELD
            check_step_transition(StepState(step.state), target)
            self._update_sequence(
                s, seq, SequenceState.RUNNING if approve else SequenceState.ABORTED
            )
            step.state = target.value
            step.reviewer = reviewer
            step.review_note = note
            if not approve:
                step.error_code = OPENING_REJECTED
            step.updated_at = utcnow()
            self._event(
                s,
                "opening_approved" if approve else "opening_rejected",
                reviewer,
                event_data,
                sequence_id,
                1,
            )
            s.flush()
            s.refresh(seq)
            return seq, step

    def review_queue(self) -> list[tuple[SequenceRow, StepRow]]:
        with self.transaction() as s:
            query = (
                select(SequenceRow, StepRow)
                .join(StepRow, StepRow.sequence_id == SequenceRow.id)
                .where(StepRow.state == StepState.REVIEW.value)
                .order_by(StepRow.updated_at)
            )
            return [(row[0], row[1]) for row in s.execute(query)]

    def decide_review(
        self,
        sequence_id: str,
        index: int,
        *,
        approve: bool,
        reviewer: str,
        note: str,
        event_data: dict[str, Any],
        public_output: dict[str, Any] | None = None,
    ) -> tuple[SequenceRow, StepRow]:
        """An output checker releases (approve) or withholds (reject) a step in review; with
        `public_output`, releases that (the table with the checker's mitigation applied)."""
        if not reviewer:
            raise InvalidRequest("a review decision needs the reviewer's name")
        with self.transaction() as s:
            seq = s.get(SequenceRow, sequence_id)
            step = s.scalars(
                select(StepRow).where(StepRow.sequence_id == sequence_id, StepRow.index == index)
            ).first()
            if seq is None or step is None:
                raise NotFound(f"step {index} of sequence {sequence_id} does not exist")
            if step.state != StepState.REVIEW or seq.state != SequenceState.REVIEW:
                raise Conflict(f"step {index} of {sequence_id} is {step.state}, not in review")
            target_step = StepState.RELEASED if approve else StepState.WITHHELD
            check_step_transition(StepState(step.state), target_step)
            self.append_script_run(s, step)
            self._update_sequence(s, seq, sequence_state_after_step(target_step, last=step.last))
            step.state = target_step.value
            step.reviewer = reviewer
            step.review_note = note
            if approve and public_output is not None:
                step.public_output = public_output
            step.updated_at = utcnow()
            step.log_index = self._event(
                s,
                "review_approved" if approve else "review_rejected",
                reviewer,
                {
                    **event_data,
                    **audit_records.outcome_data(step, step.public_output, approve),
                    "state": target_step.value,
                },
                sequence_id,
                index,
            )
            s.flush()
            s.refresh(seq)
            return seq, step
