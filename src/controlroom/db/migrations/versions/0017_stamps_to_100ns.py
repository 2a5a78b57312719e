"""stamps to 100 ns: the tick past each site stamp's microsecond

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02 09:00:00.000000

Source: docs/design.md "Stamps". Sites that stamp like .NET ``datetime2`` send seven
fractional digits; PostgreSQL's ``timestamp`` (and Python's ``datetime``) hold six. Each
stamp a site sends keeps its ``<name>_utc`` column (the instant to the microsecond, which
every index, filter and KPI reads) and gains ``<name>_tick``: the 100 ns past that
microsecond, 0-9, read with it wherever the order matters (the monotonic upsert's
tiebreaker, the reconciliation cursor) and in what the API returns.

Backfill: every stored stamp was cut to the microsecond when it was written, so its tick
is 0, the columns' default (on both databases a constant default fills the existing rows
without rewriting them). On PostgreSQL the column added to the partitioned ``audit_log``
reaches every partition; the append-only trigger does not fire for DDL.
"""

from __future__ import annotations

from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

TICKS = (
    ("site_calls", "created_at_tick"),
    ("site_calls", "updated_at_tick"),
    ("site_calls", "terminal_at_tick"),
    ("audit_log", "occurred_at_tick"),
    ("site_reconciliation", "cursor_updated_at_tick"),
)


def upgrade() -> None:
    dialect = migrating(revision)
    for table, column in TICKS:
        if dialect == "postgresql" or dialect == "sqlite":
            # The same statement on both; SQLite checks it against the existing rows too.
            op.execute(
                f"ALTER TABLE {table} ADD COLUMN {column} SMALLINT NOT NULL DEFAULT 0 "
                f"CHECK ({column} BETWEEN 0 AND 9)"
            )
        else:
            unsupported(dialect, revision)


def downgrade() -> None:
    dialect = migrating(revision)
    for table, column in reversed(TICKS):
        if dialect == "postgresql" or dialect == "sqlite":
            # SQLite (3.35+) drops a column together with its own column CHECK.
            op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        else:
            unsupported(dialect, revision)
