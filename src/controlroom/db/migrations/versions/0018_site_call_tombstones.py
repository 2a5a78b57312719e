"""site call tombstones: the id and terminal stamp of each purged site call

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02 09:30:00.000000

Source: docs/design.md "Site call retention". The retention purge writes a tombstone for
every site call it deletes, in the same transaction; while it is kept
(``sitecalls.tombstone_days`` after the purge, by ``purged_at_utc``, along its index, so at
least that long beyond retention) a late packet of that call is rejected instead of
bringing it back as a live row. The same DDL on both databases.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrating(revision)
    op.create_table(
        "site_call_tombstones",
        sa.Column("tracked_operation_id", sa.String(36), nullable=False),
        sa.Column("terminal_at_utc", sa.DateTime(), nullable=False),
        sa.Column("terminal_at_tick", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column("purged_at_utc", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tracked_operation_id", name=op.f("pk_site_call_tombstones")),
    )
    op.create_index(
        "ix_site_call_tombstones_purged_at_utc", "site_call_tombstones", ["purged_at_utc"]
    )


def downgrade() -> None:
    migrating(revision)
    op.drop_table("site_call_tombstones")
