"""site reconciliation: the persisted per-site pull cursor and pass state

Revision ID: 0010
Revises: 0005
Create Date: 2026-12-01 14:00:00.000000

Source: docs/design.md "Reconciliation". One row per configured site (created on its
first pass): the composite cursor ``(cursor_updated_at_utc, cursor_tracked_operation_id)``
a restart resumes from, the last pull, the last error, reachability and the pinned latch.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrating(revision)
    op.create_table(
        "site_reconciliation",
        sa.Column("site_id", sa.String(64), nullable=False),
        sa.Column("cursor_updated_at_utc", sa.DateTime()),
        sa.Column("cursor_tracked_operation_id", sa.String(36)),
        sa.Column("last_pull_at_utc", sa.DateTime()),
        sa.Column("last_success_at_utc", sa.DateTime()),
        sa.Column("last_error", sa.Text()),
        sa.Column("reachable", sa.Boolean(), nullable=False),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("pinned_changed_at_utc", sa.DateTime()),
        sa.Column("rows_pulled", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("site_id", name=op.f("pk_site_reconciliation")),
    )


def downgrade() -> None:
    migrating(revision)
    op.drop_table("site_reconciliation")
