"""The relational schema (SQLAlchemy 2). Portable: runs on SQLite (embedded) and PostgreSQL.

Only standard column types are used (no SQLite-only SQL). Every sequence row carries a `version`
that each update compares and increments, so concurrent reveals of one sequence cannot both win
(optimistic concurrency, which works identically on both databases).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class ProjectRow(Base):
    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class _KeyHolder:
    """Someone who signs requests with an Ed25519 key: her name, the key (PEM) and its
    fingerprint. A mixin: researchers and auditors each have their own table."""

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    public_key: Mapped[str] = mapped_column(Text)
    fingerprint: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ResearcherRow(_KeyHolder, Base):
    __tablename__ = "researchers"


class MembershipRow(Base):
    __tablename__ = "memberships"

    researcher: Mapped[str] = mapped_column(ForeignKey("researchers.name"), primary_key=True)
    project: Mapped[str] = mapped_column(ForeignKey("projects.name"), primary_key=True)


class DatasetRow(Base):
    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), index=True)
    version: Mapped[int] = mapped_column(Integer)
    project: Mapped[str] = mapped_column(ForeignKey("projects.name"))
    path: Mapped[str] = mapped_column(Text, doc="Parquet file, relative to the data directory.")
    sha256: Mapped[str] = mapped_column(String(64))
    rows: Mapped[int] = mapped_column(BigInteger)
    dataset_metadata: Mapped[dict[str, Any]] = mapped_column(JSON)
    rules_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class SequenceRow(Base):
    __tablename__ = "sequences"
    __table_args__ = (
        UniqueConstraint("researcher", "nonce"),
        # A researcher's open and aborted sequences (the withhold budget, on every step's
        # view): found by index, not by reading all of hers.
        Index("ix_sequences_researcher_state", "researcher", "state"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    researcher: Mapped[str] = mapped_column(ForeignKey("researchers.name"), index=True)
    project: Mapped[str] = mapped_column(ForeignKey("projects.name"))
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    header: Mapped[bytes] = mapped_column(LargeBinary)
    header_hash: Mapped[str] = mapped_column(String(64), unique=True)
    nonce: Mapped[str] = mapped_column(String(128))
    signature: Mapped[bytes] = mapped_column(LargeBinary)
    endorsements: Mapped[list[Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(32), index=True, doc="`states.SequenceState`")
    current_index: Mapped[int] = mapped_column(Integer, default=0)
    verifier_state: Mapped[dict[str, Any]] = mapped_column(JSON)
    version: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class StepRow(Base):
    __tablename__ = "steps"
    __table_args__ = (UniqueConstraint("sequence_id", "index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sequence_id: Mapped[str] = mapped_column(ForeignKey("sequences.id"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    trace_hash: Mapped[str] = mapped_column(String(64))
    body: Mapped[bytes] = mapped_column(LargeBinary)
    body_hash: Mapped[str] = mapped_column(String(64))
    last: Mapped[bool] = mapped_column(Boolean)
    kind: Mapped[str | None] = mapped_column(String(64), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    output: Mapped[dict[str, Any] | None] = mapped_column(
        JSON, nullable=True, doc="The full typed output, facts included; never leaves the centre."
    )
    public_output: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    run_event: Mapped[dict[str, Any] | None] = mapped_column(
        JSON,
        nullable=True,
        doc="A script run's `script_run_finished` record, held until a checker first acts on "
        "the step: appended when the run ends, it would tell the researcher its run time.",
    )
    output_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    decision: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    ruleset_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    backend: Mapped[str | None] = mapped_column(String(32), nullable=True)
    wall_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    output_salt: Mapped[bytes | None] = mapped_column(
        LargeBinary, nullable=True, doc="Opening of the output's commitment in the audit log."
    )
    log_index: Mapped[int | None] = mapped_column(
        BigInteger, nullable=True, doc="Audit-log entry that records the step's current state."
    )
    reviewer: Mapped[str | None] = mapped_column(String(128), nullable=True)
    review_note: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class NonceRow(Base):
    __tablename__ = "request_nonces"

    keyid: Mapped[str] = mapped_column(String(128), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(128), primary_key=True)
    expires_at: Mapped[int] = mapped_column(BigInteger, index=True)


class EventRow(Base):
    """One entry of the audit log: its canonical record (the Merkle leaf is SHA-256(0x00 || record))
    and, for queries, the kind, sequence and step copied out of it. Written only by
    `safeaccess.server.store.auditlog.append`, in the transaction of the change it records."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    log_index: Mapped[int] = mapped_column(BigInteger, unique=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    kind: Mapped[str] = mapped_column(String(64))
    sequence_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    step_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    actor: Mapped[str] = mapped_column(String(128))
    subject: Mapped[str | None] = mapped_column(
        String(128), nullable=True, index=True, doc="e.g. the hash of a logged rule set"
    )
    record: Mapped[bytes] = mapped_column(LargeBinary)
    #: The entry's leaf hash, then the hash of each perfect subtree of the log's Merkle tree that
    #: this entry completes, level after level (32 bytes each): the node at level l over leaves
    #: [idx * 2^l, (idx + 1) * 2^l) is kept by the entry (idx + 1) * 2^l - 1, its last leaf. Any
    #: root or proof is a few of these, so proofs cost O(log n) reads at any size; kept in the
    #: entry's own row, an append writes one row per entry and no other (`store/log.py`).
    merkle: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)

    @property
    def data(self) -> dict[str, Any]:
        """The record's `data` object (parsed from the logged bytes, never stored twice)."""
        parsed: dict[str, Any] = json.loads(self.record)["data"]
        return parsed


class AuditHeadRow(Base):
    """The log's size (one row). Appenders increment it first, which serialises appends on both
    databases: the row lock (PostgreSQL) or the write lock (SQLite) is held until commit."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    size: Mapped[int] = mapped_column(BigInteger)


class AuditorRow(_KeyHolder, Base):
    """An auditor: signs requests to the audit endpoints with this key, and reaches nothing else."""

    __tablename__ = "auditors"


class DPConfigRow(Base):
    """A dataset's differential-privacy configuration (all its versions share it and its ledgers)."""

    __tablename__ = "dp_configs"

    dataset: Mapped[str] = mapped_column(String(128), primary_key=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class DPLedgerRow(Base):
    """The privacy spent in one scope of a DP dataset: Σ(Δᵢ/σᵢ)² over its Gaussian releases.

    Written only in the transaction that records a DP release; `version` makes a charge computed
    against a stale ledger fail instead of overwriting another replica's charge.
    """

    __tablename__ = "dp_ledgers"

    key: Mapped[str] = mapped_column(String(400), primary_key=True)
    dataset: Mapped[str] = mapped_column(String(128), index=True)
    scope: Mapped[str] = mapped_column(String(16))
    owner: Mapped[str] = mapped_column(String(128))
    spent: Mapped[float] = mapped_column(Float, default=0.0)
    releases: Mapped[int] = mapped_column(Integer, default=0)
    version: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class QssSettingsRow(Base):
    """The query-set auditor's settings of a dataset name (all its versions)."""

    __tablename__ = "qss_settings"

    dataset: Mapped[str] = mapped_column(String(128), primary_key=True)
    mode: Mapped[str] = mapped_column(String(16))
    scope: Mapped[str] = mapped_column(String(16))
    atom_cap: Mapped[int] = mapped_column(BigInteger)


class QssStateRow(Base):
    """Pointer to the current auditor state of one scope: a content-addressed file under the data
    directory. Updated in the transaction that records the step it admitted, so a crash between
    writing the file and committing leaves the old state (and a re-runnable step)."""

    __tablename__ = "qss_states"

    scope: Mapped[str] = mapped_column(String(400), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    n_records: Mapped[int] = mapped_column(BigInteger)
    admitted: Mapped[int] = mapped_column(Integer, default=0, doc="Outputs admitted so far.")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ClaimRequirementRow(Base):
    """A dataset name's requirement (all its versions): analyses of `kind` run only in sequences
    endorsed by a trusted certification authority with the claim `claim` (a policy name)."""

    __tablename__ = "claim_requirements"

    dataset: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(64), primary_key=True)
    claim: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class CheckerRow(Base):
    """An output checker's account for the web review workspace (`safeaccess.server.web`).

    Created `pending` by the admin CLI with a one-time enrolment token (only its SHA-256 is kept)
    and a TOTP secret; enrolment sets the argon2id password hash and makes it `active`."""

    __tablename__ = "checkers"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    researcher: Mapped[str | None] = mapped_column(
        String(128), nullable=True, doc="The researcher identity this person also holds, if any."
    )
    state: Mapped[str] = mapped_column(String(16), doc="pending | active | disabled")
    password_hash: Mapped[str | None] = mapped_column(Text, nullable=True)
    totp_secret: Mapped[str] = mapped_column(String(64))
    last_totp_step: Mapped[int] = mapped_column(
        BigInteger, default=0, doc="Time step of the last accepted code (a code is used once)."
    )
    enrol_token_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    enrol_expires_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ReviewApprovalRow(Base):
    """A first approval of a step on a dataset that needs two checkers (two-person rule)."""

    __tablename__ = "review_approvals"
    __table_args__ = (UniqueConstraint("sequence_id", "step_index", "checker"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sequence_id: Mapped[str] = mapped_column(String(32), index=True)
    step_index: Mapped[int] = mapped_column(Integer)
    checker: Mapped[str] = mapped_column(String(128))
    mitigation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ReviewSettingsRow(Base):
    """How many different output checkers must approve a release on a dataset (all versions)."""

    __tablename__ = "review_settings"

    dataset: Mapped[str] = mapped_column(String(128), primary_key=True)
    checkers: Mapped[int] = mapped_column(Integer)


class WebSessionRow(Base):
    """A session of the review workspace (`safeaccess.server.web.sessions`), shared by every
    replica. The row is found by the SHA-256 of the cookie's random value; the value itself is
    never stored, so reading this table does not give anyone a usable cookie. Times are seconds
    since the epoch on the clock of the replica that wrote them."""

    __tablename__ = "web_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, doc="SHA-256 hex of the cookie.")
    checker: Mapped[str | None] = mapped_column(
        String(128), nullable=True, index=True, doc="None until a checker logs in."
    )
    csrf: Mapped[str] = mapped_column(String(64), doc="The session's CSRF token (forms).")
    flash: Mapped[list[str]] = mapped_column(JSON, doc="Messages for the next page shown.")
    created_at: Mapped[float] = mapped_column(Float)
    seen_at: Mapped[float] = mapped_column(Float, index=True)


class AuthFailureRow(Base):
    """One failed authentication, counted by a rate limiter (`safeaccess.server.ratelimit` for
    signed requests, `safeaccess.server.web.ratelimit` for checkers' logins) on every replica.
    `subject` is the SHA-256 of what was limited (a key id, an address, an account name), so the
    table is no record of who tried; rows older than their limiter's window are purged."""

    __tablename__ = "auth_failures"
    __table_args__ = (
        Index("ix_auth_failures_subject_at", "limiter", "subject", "at"),
        Index("ix_auth_failures_at", "limiter", "at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    limiter: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str] = mapped_column(String(64))
    at: Mapped[float] = mapped_column(Float, doc="Seconds since the epoch.")
