"""SQLite: a subset's fenced sorts read their keys from the index the subset is read by

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-05 11:20:00.000000

Source: docs/decisions.md "A subset is read from its own rows" (figures in
``benchmarks/README.md`` "``stopped.py``").

Migration 0031 gave PostgreSQL's subset indexes the fenced sorts' keys as ``INCLUDE``
columns; SQLite has no ``INCLUDE``, so its fence read each member's row from the table
(130-230 ms for a 72,000-message subset at 1,250,000 rows, rows of several kilobytes).
Here the same columns end SQLite's indexes, after the columns they are walked by, which
keep their order:

- ``ix_failed_message_groups_group_id_status_first``: ``last_modified`` after
  ``(group_id, status, first_failure_at, failed_message_id)``;
- ``ix_failed_messages_receiving_endpoint_time_sent``: ``last_modified, status`` after
  ``(receiving_endpoint, time_sent, id)``;
- ``ix_failed_messages_queue_address_lower_time_sent``: ``queue_address, last_modified,
  status`` after ``(lower(queue_address), time_sent, id)`` (the address itself: SQLite
  reads an expression's column from the index only when the column is in it).

The plan then reads the index alone (``USING COVERING INDEX``). A change of a message's
status or ``last_modified`` now rewrites these entries too (SQLite updates an index
whose columns changed). PostgreSQL: nothing (0031).
"""

from __future__ import annotations

from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None

# (index, table, the walked columns, the fenced sorts' keys after them)
INDEXES = (
    (
        "ix_failed_message_groups_group_id_status_first",
        "failed_message_groups",
        "group_id, status, first_failure_at, failed_message_id",
        "last_modified",
    ),
    (
        "ix_failed_messages_receiving_endpoint_time_sent",
        "failed_messages",
        "receiving_endpoint, time_sent, id",
        "last_modified, status",
    ),
    (
        "ix_failed_messages_queue_address_lower_time_sent",
        "failed_messages",
        "lower(queue_address), time_sent, id",
        "queue_address, last_modified, status",
    ),
)


def upgrade() -> None:
    _rebuild(covering=True)


def downgrade() -> None:
    _rebuild(covering=False)


def _rebuild(*, covering: bool) -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        return  # INCLUDE since 0031
    if dialect != "sqlite":
        unsupported(dialect, revision)
    for name, table, walked, keys in INDEXES:
        op.execute(f"DROP INDEX {name}")
        columns = f"{walked}, {keys}" if covering else walked
        op.execute(f"CREATE INDEX {name} ON {table} ({columns})")
