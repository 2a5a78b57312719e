"""notification outbox: the failure groups a rule's notification counts

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-04 21:00:00.000000

Source: docs/decisions.md "A rule's notification counts its groups' failures when it is
sent". ``failure_groups`` holds, for a rule's notification whose events name failure
groups (``FailureGroupAppeared``, ``GroupFailuresPassedThreshold``), a JSON object: the
window (``from``, ``to``), the groups' ids with their failed messages in it (``null``
until its first claim counts them), and whether further groups were left uncounted
(``more``); ``NULL`` for every other notification.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrating(revision)
    op.add_column(
        "notifications",
        sa.Column(
            "failure_groups",
            sa.Text(),
            nullable=True,
            comment="JSON: the window and its failure groups' failed messages",
        ),
    )


def downgrade() -> None:
    migrating(revision)
    op.drop_column("notifications", "failure_groups")
