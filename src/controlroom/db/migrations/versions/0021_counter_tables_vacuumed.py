"""counter tables vacuumed: per-table autovacuum settings for the tables a drain rewrites

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04 08:00:00.000000

Source: docs/decisions.md "The counter tables are vacuumed as they turn over"
(``benchmarks/drain.py``, figures in ``benchmarks/README.md``). A drain turns the counter
tables over many times while they stay small, and leaves dead group rows and messages
behind every later attempt; the server-wide defaults (vacuum after 20 % of a table is
dead) wait for a million dead group rows at five million, and let the counters' dead
rows pile up between a vacuum's passes.

PostgreSQL (storage parameters of each table; ``RESET`` on the way down):

- ``failed_message_group_counts``, ``failed_message_tally_deltas``,
  ``failed_message_tallies``: vacuumed at autovacuum's next look once ``COUNTER_THRESHOLD``
  rows are dead, whatever their size (``autovacuum_vacuum_scale_factor = 0``), without the
  cost-based pauses (small tables: a pass takes milliseconds); the tallies, updated in
  place on a column no index holds, keep half of each page free so that the update stays
  on its page (``fillfactor = 50``: a HOT update, no new index entry).
- ``failed_messages`` and ``failed_message_groups``: vacuumed once 2 % of the table is dead
  or newly inserted (``autovacuum_vacuum_scale_factor``,
  ``autovacuum_vacuum_insert_scale_factor``), so the dead rows of later attempts stay
  under 2 % and the visibility map keeps index-only scans off the heap.

SQLite has no vacuum to configure (it reuses freed pages itself): nothing to do.
"""

from __future__ import annotations

from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

COUNTER_THRESHOLD = 200
LARGE_SCALE_FACTOR = 0.02

SETTINGS: dict[str, dict[str, str]] = {
    **{
        table: {
            "autovacuum_vacuum_scale_factor": "0",
            "autovacuum_vacuum_threshold": str(COUNTER_THRESHOLD),
            "autovacuum_vacuum_cost_delay": "0",
        }
        for table in (
            "failed_message_group_counts",
            "failed_message_tally_deltas",
            "failed_message_tallies",
        )
    },
    **{
        table: {
            "autovacuum_vacuum_scale_factor": str(LARGE_SCALE_FACTOR),
            "autovacuum_vacuum_insert_scale_factor": str(LARGE_SCALE_FACTOR),
        }
        for table in ("failed_messages", "failed_message_groups")
    },
}
SETTINGS["failed_message_tallies"]["fillfactor"] = "50"


def upgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        for table, settings in SETTINGS.items():
            options = ", ".join(f"{name} = {value}" for name, value in settings.items())
            op.execute(f"ALTER TABLE {table} SET ({options})")
    elif dialect == "sqlite":
        pass
    else:
        unsupported(dialect, revision)


def downgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        for table, settings in SETTINGS.items():
            op.execute(f"ALTER TABLE {table} RESET ({', '.join(settings)})")
    elif dialect == "sqlite":
        pass
    else:
        unsupported(dialect, revision)
