"""retry operation messages: the failed messages each retry operation claimed

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-05 17:20:00.000000

Source: docs/decisions.md "A retry's outcome counts the failures since". A retry's outcome
counts the messages it claimed that have failed again since it started. Read from what the
operation selected (its group, queue address or endpoint), a message that failed again
with another exception (another group) or in another queue was missed, and a selection of
ids was not kept at all; a claim (``failed_message_retries``) cannot tell either, since a
new failure releases it. ``retry_operation_messages`` keeps each operation's claimed ids,
written in the transaction that claims them, and goes with its operation (the retention
sweep's purge of completed operations).

The table is filled from the claims the operations' batches still hold: messages sent and
neither confirmed nor failed again yet. A message that failed again before this migration
is not counted for an operation that started before it. The same DDL on both providers.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None

TABLE = "retry_operation_messages"


def upgrade() -> None:
    migrating(revision)
    op.create_table(
        TABLE,
        sa.Column("operation_id", sa.String(36), nullable=False),
        sa.Column("failed_message_id", sa.String(36), nullable=False),
        sa.PrimaryKeyConstraint("operation_id", "failed_message_id", name=op.f(f"pk_{TABLE}")),
    )
    op.execute(
        f"INSERT INTO {TABLE} (operation_id, failed_message_id) "
        "SELECT b.request_id, c.failed_message_id "
        "FROM failed_message_retries c JOIN retry_batches b ON b.id = c.retry_batch_id "
        "WHERE b.request_id IN (SELECT id FROM retry_operations)"
    )


def downgrade() -> None:
    migrating(revision)
    op.drop_table(TABLE)
