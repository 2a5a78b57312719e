"""retry claims in flight: a window's claims are marked before they are sent

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-06 03:00:00.000000

Source: docs/decisions.md "A window in flight is claimed". The retry processor checked its
lease before each window of sends, and nothing else stopped another process that took the
lease over from reading the same unsent claims while the window was still being sent: a
lease lost mid-window (a PostgreSQL session ended, a process paused past a SQLite lease)
sent the window twice. ``in_flight_until`` marks a window's claims, in a conditional
update, before any of them is sent; another process takes only claims whose mark is absent
or past. The same DDL on both providers (a nullable column: no table rebuild on SQLite).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrating(revision)
    op.add_column(
        "failed_message_retries",
        sa.Column(
            "in_flight_until",
            sa.DateTime(),
            nullable=True,
            comment="a window's sends are under way until then",
        ),
    )


def downgrade() -> None:
    migrating(revision)
    with op.batch_alter_table("failed_message_retries") as batch_op:
        batch_op.drop_column("in_flight_until")
