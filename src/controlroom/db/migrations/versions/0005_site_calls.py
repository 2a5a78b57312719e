"""site call audit: site_calls, append-only audit_log, rejected_telemetry, kpi_samples

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 13:40:00.000000

Source: docs/design.md "Site call audit". Widths are characters. PostgreSQL's
``varchar(n)`` refuses a longer value; SQLite enforces no width, so every bounded column
carries a ``CHECK (length(col) <= n)`` there (``length`` counts characters on both), and a
value longer than its column is refused by the store too, never truncated.

On PostgreSQL ``audit_log`` is partitioned by month of ``occurred_at_utc`` (a partition per
month, the current one and two ahead made here, later ones by the purge; a default
partition for the rest), so the purge drops whole months; ``audit_event_ids`` keeps
``event_id`` unique across partitions.

The audit log is append-only in the database: a trigger refuses every UPDATE, and every
DELETE unless the purge permits it in its own transaction (PostgreSQL: the
transaction-local setting ``controlroom.audit_purge = 'on'``; SQLite: a row in
``audit_purge_permits`` that the purge inserts and removes inside its transaction). See
``Provider.permit_audit_purge``. PostgreSQL also refuses TRUNCATE.

Indexes, one per query (``controlroom.sitecalls``): the list's keyset order, overall and
per site or status; the KPIs' pending rows (a partial index of non-terminal rows) and
terminal rows by terminal time (also the retention purge); the audit log's keyset order
(also its purge) and its actor, target and correlation-id filters; the rejected list.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import Dialect, migrating, unsupported

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

AUDIT_DEFAULT_PARTITION = "audit_log_default"
AUDIT_MONTHS_AHEAD = 2
"""Months after the current one whose partitions this migration makes (a copy of the
PostgreSQL provider's rule as it was: migrations never run live code)."""

NON_TERMINAL = "('Submitted', 'Forwarded', 'Attempted', 'Skipped', 'Parked')"

# (table, column, width) of every bounded text column, for SQLite's CHECKs.
BOUNDED = (
    ("site_calls", "tracked_operation_id", 36),
    ("site_calls", "channel", 32),
    ("site_calls", "target", 256),
    ("site_calls", "source_site", 64),
    ("site_calls", "source_node", 64),
    ("site_calls", "status", 32),
    ("site_calls", "last_error", 1024),
    ("audit_log", "event_id", 36),
    ("audit_log", "actor", 256),
    ("audit_log", "action", 64),
    ("audit_log", "outcome", 16),
    ("audit_log", "category", 32),
    ("audit_log", "target", 256),
    ("audit_log", "source_site", 64),
    ("audit_log", "source_node", 64),
    ("audit_log", "correlation_id", 36),
)


def _checks(dialect: Dialect, table: str) -> list[sa.CheckConstraint]:
    if dialect == "postgresql":
        return []  # varchar(n) refuses a longer value
    elif dialect == "sqlite":
        return [
            sa.CheckConstraint(f"length({column}) <= {width}", name=f"ck_{table}_{column}_width")
            for name, column, width in BOUNDED
            if name == table
        ]
    else:
        unsupported(dialect, revision)


def upgrade() -> None:
    dialect = migrating(revision)
    utc = sa.DateTime
    op.create_table(
        "site_calls",
        sa.Column("tracked_operation_id", sa.String(36), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False, comment="ApiOutbound | DbOutbound"),
        sa.Column("target", sa.String(256), nullable=False),
        sa.Column("source_site", sa.String(64), nullable=False),
        sa.Column("source_node", sa.String(64), nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("retry_count", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.String(1024), nullable=True),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("created_at_utc", utc(), nullable=False),
        sa.Column("updated_at_utc", utc(), nullable=False),
        sa.Column("terminal_at_utc", utc(), nullable=True),
        sa.Column("ingested_at_utc", utc(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("tracked_operation_id", name=op.f("pk_site_calls")),
        *_checks(dialect, "site_calls"),
    )
    op.create_index(
        "ix_site_calls_created_at_utc_id", "site_calls", ["created_at_utc", "tracked_operation_id"]
    )
    op.create_index(
        "ix_site_calls_source_site_created_at_utc_id",
        "site_calls",
        ["source_site", "created_at_utc", "tracked_operation_id"],
    )
    op.create_index(
        "ix_site_calls_status_created_at_utc_id",
        "site_calls",
        ["status", "created_at_utc", "tracked_operation_id"],
    )
    pending = sa.text(f"status IN {NON_TERMINAL}")
    op.create_index(
        "ix_site_calls_pending",
        "site_calls",
        ["source_site", "source_node", "status", "created_at_utc"],
        postgresql_where=pending,
        sqlite_where=pending,
    )
    terminal = sa.text("terminal_at_utc IS NOT NULL")
    op.create_index(
        "ix_site_calls_terminal",
        "site_calls",
        ["terminal_at_utc", "status", "source_site", "source_node"],
        postgresql_where=terminal,
        sqlite_where=terminal,
    )

    # PostgreSQL: partitioned by month (the purge drops whole months); a partitioned
    # table's primary key must hold the partition key, and audit_event_ids keeps
    # event_id unique across months (Provider.insert_audit_events).
    if dialect == "postgresql":
        audit_key: tuple[str, ...] = ("event_id", "occurred_at_utc")
        partitioning: dict[str, Any] = {"postgresql_partition_by": "RANGE (occurred_at_utc)"}
    elif dialect == "sqlite":
        audit_key, partitioning = ("event_id",), {}
    else:
        unsupported(dialect, revision)
    op.create_table(
        "audit_log",
        sa.Column("event_id", sa.String(36), nullable=False),
        sa.Column("occurred_at_utc", utc(), nullable=False),
        sa.Column("ingested_at_utc", utc(), nullable=False),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False, comment="Success | Failure | Denied"),
        sa.Column("category", sa.String(32), nullable=False),
        sa.Column("target", sa.String(256), nullable=True),
        sa.Column("source_site", sa.String(64), nullable=True),
        sa.Column("source_node", sa.String(64), nullable=True),
        sa.Column("correlation_id", sa.String(36), nullable=True),
        sa.Column("details_json", sa.Text(), nullable=True),
        sa.Column("payload_truncated", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint(*audit_key, name=op.f("pk_audit_log")),
        *_checks(dialect, "audit_log"),
        **partitioning,
    )
    if dialect == "postgresql":
        _create_audit_partitions()
    elif dialect == "sqlite":
        pass  # one table: SQLite has no partitions
    else:
        unsupported(dialect, revision)
    op.create_index("ix_audit_log_occurred_at_utc_id", "audit_log", ["occurred_at_utc", "event_id"])
    for column in ("actor", "target", "correlation_id"):
        op.create_index(
            f"ix_audit_log_{column}_occurred_at_utc_id",
            "audit_log",
            [column, "occurred_at_utc", "event_id"],
        )

    op.create_table(
        "rejected_telemetry",
        sa.Column("id", sa.String(36), nullable=False, comment="hash of the packet"),
        sa.Column("source", sa.String(300), nullable=False, comment="queue name or 'http'"),
        sa.Column("packet", sa.LargeBinary(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("rejected_at_utc", utc(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rejected_telemetry")),
    )
    op.create_index(
        "ix_rejected_telemetry_rejected_at_utc_id", "rejected_telemetry", ["rejected_at_utc", "id"]
    )

    op.create_table(
        "kpi_samples",
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False, comment="global | site | node"),
        sa.Column("scope_key", sa.String(200), nullable=False, comment="'' | site | site/node"),
        sa.Column("captured_at_utc", utc(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(
            "source", "metric", "scope", "scope_key", "captured_at_utc", name=op.f("pk_kpi_samples")
        ),
    )
    op.create_index("ix_kpi_samples_captured_at_utc", "kpi_samples", ["captured_at_utc"])
    _create_append_only_guard(dialect)


def downgrade() -> None:
    _drop_append_only_guard(migrating(revision))
    op.drop_table("kpi_samples")
    op.drop_table("rejected_telemetry")
    op.drop_table("audit_log")
    op.drop_table("site_calls")


def _create_audit_partitions() -> None:
    op.execute(f"CREATE TABLE {AUDIT_DEFAULT_PARTITION} PARTITION OF audit_log DEFAULT")
    now = datetime.now(UTC).replace(tzinfo=None)
    for ahead in range(AUDIT_MONTHS_AHEAD + 1):
        start, end = _month(now, ahead), _month(now, ahead + 1)
        op.execute(
            f"CREATE TABLE IF NOT EXISTS audit_log_p{start:%Y%m} PARTITION OF audit_log "
            f"FOR VALUES FROM ('{start:%Y-%m-%d}') TO ('{end:%Y-%m-%d}')"
        )
    op.create_table(
        "audit_event_ids",
        sa.Column("event_id", sa.String(36), nullable=False),
        sa.Column("occurred_at_utc", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_audit_event_ids")),
    )
    op.create_index("ix_audit_event_ids_occurred_at_utc", "audit_event_ids", ["occurred_at_utc"])


def _month(moment: datetime, months_after: int) -> datetime:
    """The first instant (naive UTC) of the month ``months_after`` the one of ``moment``
    (naive UTC)."""
    index = moment.year * 12 + moment.month - 1 + months_after
    return datetime(index // 12, index % 12 + 1, 1)


def _create_append_only_guard(dialect: Dialect) -> None:
    if dialect == "postgresql":
        op.execute(
            "CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN "
            "IF TG_OP = 'DELETE' AND current_setting('controlroom.audit_purge', true) = 'on' "
            "THEN RETURN OLD; END IF; "
            "RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP "
            "USING ERRCODE = 'insufficient_privilege'; "
            "END $$"
        )
        op.execute(
            "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
            "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()"
        )
        op.execute(
            "CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()"
        )
    elif dialect == "sqlite":
        op.execute("CREATE TABLE audit_purge_permits (id INTEGER PRIMARY KEY)")
        op.execute(
            "CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log BEGIN "
            "SELECT RAISE(ABORT, 'audit_log is append-only: UPDATE refused'); END"
        )
        op.execute(
            "CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log "
            "WHEN NOT EXISTS (SELECT 1 FROM audit_purge_permits) BEGIN "
            "SELECT RAISE(ABORT, 'audit_log is append-only: DELETE refused'); END"
        )
    else:
        unsupported(dialect, revision)


def _drop_append_only_guard(dialect: Dialect) -> None:
    if dialect == "postgresql":
        op.execute("DROP TABLE IF EXISTS audit_event_ids")
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_truncate ON audit_log")
        op.execute("DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log")
        op.execute("DROP FUNCTION IF EXISTS audit_log_append_only()")
    elif dialect == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_delete")
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_update")
        op.execute("DROP TABLE IF EXISTS audit_purge_permits")
    else:
        unsupported(dialect, revision)
