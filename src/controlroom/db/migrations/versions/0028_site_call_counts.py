"""site call counts: the non-terminal site calls counted per site, node and status by the database

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-04 14:30:00.000000

Source: docs/decisions.md "The database keeps the counts" (figures in ``benchmarks/README.md``
"``sitecalls.py``"). The site-call KPIs counted every non-terminal call at each reading (an
index-only scan of ``ix_site_calls_pending``): 18 ms at 30,000 calls in flight on a quiet
machine, growing with the backlog, against a budget of 20 ms.

``site_call_counts`` holds signed counts per (``source_site``, ``source_node``,
``status``) of the site calls in a non-terminal status (``ix_site_calls_pending``'s
predicate); a key's count is the SUM of its rows, the number of such calls at every
committed state. Kept by triggers on ``site_calls`` (``migrations._counters``):
PostgreSQL's statement-level triggers append each statement's net change per key, folded
by ``Provider.compact_counts``; SQLite's row triggers keep one row per key. ``source_node``
may be NULL, one key like any other value.

The counts of existing rows are filled in this migration's transaction, with
``site_calls`` locked against writes (PostgreSQL) until the commit, so no write falls
between the fill and the triggers. PostgreSQL vacuums the counts as migration 0021 does the
failed messages' counters (a fixed threshold of dead rows, no cost pauses).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._counters import (
    CountedRows,
    create_postgresql_triggers,
    create_sqlite_triggers,
    drop_postgresql_triggers,
    drop_sqlite_triggers,
)
from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

COUNTS = "site_call_counts"
# ix_site_calls_pending's predicate (migration 0005).
NON_TERMINAL = "('Submitted', 'Forwarded', 'Attempted', 'Skipped', 'Parked')"
ROWS = CountedRows(
    table="site_calls",
    counts=COUNTS,
    key=("source_site", "source_node", "status"),
    nullable=("source_node",),
    condition=lambda row: f"{row}.status IN {NON_TERMINAL}",
    name="site_calls_count",
)
# Migration 0021's settings of the counter tables.
VACUUM = "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200, " + (
    "autovacuum_vacuum_cost_delay = 0"
)


def upgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        op.execute("LOCK TABLE site_calls IN SHARE ROW EXCLUSIVE MODE")
    elif dialect == "sqlite":
        pass  # one writer at a time: the migration holds the write lock to its commit
    else:
        unsupported(dialect, revision)
    op.create_table(
        COUNTS,
        sa.Column("source_site", sa.String(64), nullable=False),
        sa.Column("source_node", sa.String(64)),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_site_call_counts_key", COUNTS, ["source_site", "source_node", "status"])
    op.execute(ROWS.fill())
    if dialect == "postgresql":
        create_postgresql_triggers(ROWS)
        op.execute(f"ALTER TABLE {COUNTS} SET ({VACUUM})")
    elif dialect == "sqlite":
        create_sqlite_triggers(ROWS)
    else:
        unsupported(dialect, revision)


def downgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        drop_postgresql_triggers(ROWS)
    elif dialect == "sqlite":
        drop_sqlite_triggers(ROWS)
    else:
        unsupported(dialect, revision)
    op.drop_table(COUNTS)
