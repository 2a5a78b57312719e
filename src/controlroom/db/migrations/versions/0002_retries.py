"""retries: retry operations, per-claim send state, service leases

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 19:30:00.000000

``failed_message_retries`` gains what the retry processor persists when it stages a
batch (the attempt's message id and destination) and when the broker confirmed the
send; ``retry_operations`` records each retry request for progress and history;
``service_leases`` holds time-limited leases of background singletons on providers
without advisory locks (SQLite).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrating(revision)
    # Plain ADD COLUMN (nullable, no constraint) works on every provider, SQLite too,
    # without recreating the table.
    op.add_column(
        "failed_message_retries",
        sa.Column(
            "attempt_message_id",
            sa.String(length=36),
            nullable=True,
            comment="ServiceControl.Retry.Attempt.MessageId",
        ),
    )
    op.add_column(
        "failed_message_retries",
        sa.Column(
            "destination",
            sa.String(length=400),
            nullable=True,
            comment="address the retry is sent to",
        ),
    )
    op.add_column(
        "failed_message_retries",
        sa.Column(
            "sent_at",
            sa.DateTime(),
            nullable=True,
            comment="when the broker confirmed the send",
        ),
    )
    op.create_table(
        "retry_operations",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column(
            "retry_type", sa.String(length=50), nullable=False, comment="ServiceControl's RetryType"
        ),
        sa.Column(
            "target",
            sa.String(length=400),
            nullable=True,
            comment="group id, queue address, endpoint or message id",
        ),
        sa.Column("originator", sa.Text(), nullable=True),
        sa.Column("classifier", sa.String(length=100), nullable=True),
        sa.Column("message_count", sa.Integer(), nullable=False, comment="messages claimed"),
        sa.Column(
            "forwarded_count",
            sa.Integer(),
            nullable=False,
            comment="sent, confirmed by the broker",
        ),
        sa.Column("skipped_count", sa.Integer(), nullable=False, comment="claimed, then not sent"),
        sa.Column("failed", sa.Boolean(), nullable=False, comment="a message could not be sent"),
        sa.Column(
            "acknowledged", sa.Boolean(), nullable=False, comment="the operator dismissed it"
        ),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("last_modified", sa.DateTime(), nullable=False),
        sa.Column(
            "prepared_at",
            sa.DateTime(),
            nullable=True,
            comment="every batch of the request exists",
        ),
        sa.Column("completed_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_retry_operations")),
    )
    op.create_index(
        "ix_retry_operations_target_retry_type", "retry_operations", ["target", "retry_type"]
    )
    op.create_index("ix_retry_operations_completed_at", "retry_operations", ["completed_at"])
    op.create_table(
        "service_leases",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("owner", sa.String(length=100), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_service_leases")),
    )


def downgrade() -> None:
    migrating(revision)
    op.drop_table("service_leases")
    op.drop_index("ix_retry_operations_completed_at", table_name="retry_operations")
    op.drop_index("ix_retry_operations_target_retry_type", table_name="retry_operations")
    op.drop_table("retry_operations")
    with op.batch_alter_table("failed_message_retries") as batch_op:
        batch_op.drop_column("sent_at")
        batch_op.drop_column("destination")
        batch_op.drop_column("attempt_message_id")
