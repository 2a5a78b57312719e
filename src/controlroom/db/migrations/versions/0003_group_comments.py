"""group comments: an operator's note on a failure group

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 21:00:00.000000

``failed_message_group_comments`` holds one comment per failure group id
(``POST|DELETE /api/recoverability/groups/{groupId}/comment``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrating(revision)
    op.create_table(
        "failed_message_group_comments",
        sa.Column("group_id", sa.String(length=36), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("group_id", name=op.f("pk_failed_message_group_comments")),
    )


def downgrade() -> None:
    migrating(revision)
    op.drop_table("failed_message_group_comments")
