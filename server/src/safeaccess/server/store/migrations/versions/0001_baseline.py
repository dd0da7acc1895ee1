"""Baseline: the schema every release before migrations created (`create_all`, up to 46b8f63).

A database made by those releases has these tables and no `alembic_version`; `store.migrate`
stamps it with this revision before upgrading it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from safeaccess.server.store.migrations.tables import create_audit_nodes

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    create_audit_nodes()
    op.create_table(
        "auditors",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "checkers",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("researcher", sa.String(length=128), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("password_hash", sa.Text(), nullable=True),
        sa.Column("totp_secret", sa.String(length=64), nullable=False),
        sa.Column("last_totp_step", sa.BigInteger(), nullable=False),
        sa.Column("enrol_token_sha256", sa.String(length=64), nullable=True),
        sa.Column("enrol_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "claim_requirements",
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("claim", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("dataset", "kind", "claim"),
    )
    op.create_table(
        "dp_configs",
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("dataset"),
    )
    op.create_table(
        "dp_ledgers",
        sa.Column("key", sa.String(length=400), nullable=False),
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("spent", sa.Float(), nullable=False),
        sa.Column("releases", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    with op.batch_alter_table("dp_ledgers", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_dp_ledgers_dataset"), ["dataset"], unique=False)

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("log_index", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("sequence_id", sa.String(length=32), nullable=True),
        sa.Column("step_index", sa.Integer(), nullable=True),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("subject", sa.String(length=128), nullable=True),
        sa.Column("record", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("log_index"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_events_sequence_id"), ["sequence_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_events_subject"), ["subject"], unique=False)

    op.create_table(
        "projects",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "qss_settings",
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("atom_cap", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("dataset"),
    )
    op.create_table(
        "qss_states",
        sa.Column("scope", sa.String(length=400), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("n_records", sa.BigInteger(), nullable=False),
        sa.Column("admitted", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope"),
    )
    op.create_table(
        "request_nonces",
        sa.Column("keyid", sa.String(length=128), nullable=False),
        sa.Column("nonce", sa.String(length=128), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("keyid", "nonce"),
    )
    with op.batch_alter_table("request_nonces", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_request_nonces_expires_at"), ["expires_at"], unique=False
        )

    op.create_table(
        "researchers",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "review_approvals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("sequence_id", sa.String(length=32), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("checker", sa.String(length=128), nullable=False),
        sa.Column("mitigation", sa.JSON(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sequence_id", "step_index", "checker"),
    )
    with op.batch_alter_table("review_approvals", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_review_approvals_sequence_id"), ["sequence_id"], unique=False
        )

    op.create_table(
        "review_settings",
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("checkers", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("dataset"),
    )
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("project", sa.String(length=128), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("dataset_metadata", sa.JSON(), nullable=False),
        sa.Column("rules_path", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project"],
            ["projects.name"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", "version"),
    )
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_datasets_name"), ["name"], unique=False)

    op.create_table(
        "memberships",
        sa.Column("researcher", sa.String(length=128), nullable=False),
        sa.Column("project", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["project"],
            ["projects.name"],
        ),
        sa.ForeignKeyConstraint(
            ["researcher"],
            ["researchers.name"],
        ),
        sa.PrimaryKeyConstraint("researcher", "project"),
    )
    op.create_table(
        "sequences",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("researcher", sa.String(length=128), nullable=False),
        sa.Column("project", sa.String(length=128), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("header", sa.LargeBinary(), nullable=False),
        sa.Column("header_hash", sa.String(length=64), nullable=False),
        sa.Column("nonce", sa.String(length=128), nullable=False),
        sa.Column("signature", sa.LargeBinary(), nullable=False),
        sa.Column("endorsements", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("current_index", sa.Integer(), nullable=False),
        sa.Column("verifier_state", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
        ),
        sa.ForeignKeyConstraint(
            ["project"],
            ["projects.name"],
        ),
        sa.ForeignKeyConstraint(
            ["researcher"],
            ["researchers.name"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("header_hash"),
        sa.UniqueConstraint("researcher", "nonce"),
    )
    with op.batch_alter_table("sequences", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sequences_researcher"), ["researcher"], unique=False)

    op.create_table(
        "steps",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("sequence_id", sa.String(length=32), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("trace_hash", sa.String(length=64), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("body_hash", sa.String(length=64), nullable=False),
        sa.Column("last", sa.Boolean(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("output", sa.JSON(), nullable=True),
        sa.Column("public_output", sa.JSON(), nullable=True),
        sa.Column("output_hash", sa.String(length=64), nullable=True),
        sa.Column("decision", sa.JSON(), nullable=True),
        sa.Column("ruleset_hash", sa.String(length=64), nullable=True),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("backend", sa.String(length=32), nullable=True),
        sa.Column("wall_seconds", sa.Float(), nullable=True),
        sa.Column("output_salt", sa.LargeBinary(), nullable=True),
        sa.Column("log_index", sa.BigInteger(), nullable=True),
        sa.Column("reviewer", sa.String(length=128), nullable=True),
        sa.Column("review_note", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["sequence_id"],
            ["sequences.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sequence_id", "index"),
    )
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_steps_sequence_id"), ["sequence_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_steps_sequence_id"))

    op.drop_table("steps")
    with op.batch_alter_table("sequences", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sequences_researcher"))

    op.drop_table("sequences")
    op.drop_table("memberships")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_datasets_name"))

    op.drop_table("datasets")
    op.drop_table("review_settings")
    with op.batch_alter_table("review_approvals", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_review_approvals_sequence_id"))

    op.drop_table("review_approvals")
    op.drop_table("researchers")
    with op.batch_alter_table("request_nonces", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_request_nonces_expires_at"))

    op.drop_table("request_nonces")
    op.drop_table("qss_states")
    op.drop_table("qss_settings")
    op.drop_table("projects")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_subject"))
        batch_op.drop_index(batch_op.f("ix_events_sequence_id"))

    op.drop_table("events")
    with op.batch_alter_table("dp_ledgers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_dp_ledgers_dataset"))

    op.drop_table("dp_ledgers")
    op.drop_table("dp_configs")
    op.drop_table("claim_requirements")
    op.drop_table("checkers")
    op.drop_table("auditors")
    op.drop_table("audit_nodes")
    op.drop_table("audit_head")
