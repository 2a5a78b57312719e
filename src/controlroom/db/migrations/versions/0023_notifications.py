"""notification outbox: the notifications table

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04 08:00:00.000000

Source: docs/design.md "Notification outbox". One row per notification; widths are
characters. PostgreSQL's ``varchar(n)`` refuses a longer value; SQLite enforces no
width, so each bounded column carries a ``CHECK (length(col) <= n)`` there: a value
longer than its column is refused by the store too, never truncated.

Indexes, one per query: the dispatcher's claim of due rows (``next_attempt_at_utc``),
the list's keyset order, overall and per status, the retention purge
(``terminal_at_utc``), and ``(source, source_event_id)`` unique, so that a replayed event
never makes a second notification of one rule.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import Dialect, migrating, unsupported

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

BOUNDED = (
    ("notification_id", 36),
    ("source", 128),
    ("channel", 16),
    ("target", 256),
    ("subject", 256),
    ("severity", 16),
    ("status", 16),
    ("last_error", 1024),
    ("source_event_id", 200),
    ("claim_token", 36),
)


def _checks(dialect: Dialect) -> list[sa.CheckConstraint]:
    if dialect == "postgresql":
        return []  # varchar(n) refuses a longer value
    elif dialect == "sqlite":
        return [
            sa.CheckConstraint(
                f"length({column}) <= {width}", name=f"ck_notifications_{column}_width"
            )
            for column, width in BOUNDED
        ]
    else:
        unsupported(dialect, revision)


def upgrade() -> None:
    dialect = migrating(revision)
    utc = sa.DateTime
    op.create_table(
        "notifications",
        sa.Column("notification_id", sa.String(36), nullable=False),
        sa.Column("source", sa.String(128), nullable=False),
        sa.Column("channel", sa.String(16), nullable=False, comment="Email | Webhook"),
        sa.Column("target", sa.String(256), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("retry_count", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.String(1024), nullable=True),
        sa.Column("reply_code", sa.Integer(), nullable=True),
        sa.Column("created_at_utc", utc(), nullable=False),
        sa.Column("updated_at_utc", utc(), nullable=False),
        sa.Column("next_attempt_at_utc", utc(), nullable=True),
        sa.Column("terminal_at_utc", utc(), nullable=True),
        sa.Column("source_event_id", sa.String(200), nullable=True),
        sa.Column("payload", sa.Text(), nullable=True),
        sa.Column("delivered_to", sa.Text(), nullable=True),
        sa.Column("claim_token", sa.String(36), nullable=True),
        sa.Column("event_count", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("notification_id", name=op.f("pk_notifications")),
        *_checks(dialect),
    )
    op.create_index(
        "ix_notifications_next_attempt_at_utc", "notifications", ["next_attempt_at_utc"]
    )
    op.create_index(
        "ix_notifications_created_at_utc", "notifications", ["created_at_utc", "notification_id"]
    )
    op.create_index(
        "ix_notifications_status",
        "notifications",
        ["status", "created_at_utc", "notification_id"],
    )
    op.create_index("ix_notifications_terminal_at_utc", "notifications", ["terminal_at_utc"])
    op.create_index(
        "uq_notifications_source_source_event_id",
        "notifications",
        ["source", "source_event_id"],
        unique=True,
    )


def downgrade() -> None:
    migrating(revision)
    op.drop_table("notifications")
