"""operations: pending body deletions and the event log

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-01 13:40:00.000000

``body_deletions`` names the messages whose external bodies the retention sweep left to
the body collector (docs/decisions.md "No committed row points at a missing body");
``event_log_items`` is the operators' event log
(``GET /api/eventlogitems``); ``retry_operations.failure_reason`` says why a retry gave
messages up (docs/decisions.md "A refused retry is given up after five sends").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrating(revision)
    op.create_table(
        "body_deletions",
        sa.Column("failed_message_id", sa.String(length=36), nullable=False),
        sa.Column("requested_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("failed_message_id", name=op.f("pk_body_deletions")),
    )
    op.create_table(
        "event_log_items",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("severity", sa.String(length=20), nullable=False),
        sa.Column("category", sa.String(length=100), nullable=False),
        sa.Column("event_type", sa.String(length=100), nullable=False),
        sa.Column("related_to_json", sa.Text(), nullable=False),
        sa.Column("raised_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event_log_items")),
    )
    op.create_index("ix_event_log_items_raised_at", "event_log_items", ["raised_at"])
    with op.batch_alter_table("retry_operations") as batch:
        batch.add_column(sa.Column("failure_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    migrating(revision)
    with op.batch_alter_table("retry_operations") as batch:
        batch.drop_column("failure_reason")
    op.drop_index("ix_event_log_items_raised_at", table_name="event_log_items")
    op.drop_table("event_log_items")
    op.drop_table("body_deletions")
