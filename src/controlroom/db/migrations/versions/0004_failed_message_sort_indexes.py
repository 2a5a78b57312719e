"""failed-message list indexes: each common sort key followed by the id

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 20:30:00.000000

``/api/errors`` orders by a sort key, then by the id in the same direction, with empty
values smallest (``errors.queries.order_by``). An index on exactly that order lets a page
be read from the index, in either direction, instead of sorting every row.
``benchmarks/query.py`` on 1,000,000 rows (PostgreSQL, p50): the first page 530 -> 50 ms,
a page at offset 500,000 790 -> 108 ms, ``sort=modified`` 540 -> 54 ms (the rest of each
answer is the exact ``Total-Count``); see ``benchmarks/README.md``.

- ``time_sent`` (the default sort) and ``last_failure_at`` (``time_of_failure``) replace
  their single-column indexes, which the new ones cover;
- ``last_modified`` (``modified``) is new: the sort, and a ``modified`` range without a
  status filter (with one, ``ix_failed_messages_status_last_modified`` serves);
- ``message_type`` is new: the list's other common sort.

PostgreSQL puts empty values last ascending unless told, so its indexes of the nullable
columns say ``NULLS FIRST``; SQLite's order is already that, and it accepts no
``NULLS FIRST`` in an index.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TABLE = "failed_messages"
# (index name, sort column, the column is nullable)
SORT_INDEXES = (
    ("ix_failed_messages_time_sent_id", "time_sent", True),
    ("ix_failed_messages_last_failure_at_id", "last_failure_at", False),
    ("ix_failed_messages_last_modified_id", "last_modified", False),
    ("ix_failed_messages_message_type_id", "message_type", True),
)
REPLACED = (
    ("ix_failed_messages_time_sent", "time_sent"),
    ("ix_failed_messages_last_failure_at", "last_failure_at"),
)


def upgrade() -> None:
    dialect = migrating(revision)
    for name, column, nullable in SORT_INDEXES:
        if dialect == "postgresql":
            leading = sa.text(f"{column} NULLS FIRST") if nullable else column
        elif dialect == "sqlite":
            leading = column  # SQLite sorts NULLs first in ascending order already
        else:
            unsupported(dialect, revision)
        op.create_index(name, TABLE, [leading, "id"])
    for name, _ in REPLACED:
        op.drop_index(name, table_name=TABLE)


def downgrade() -> None:
    migrating(revision)
    for name, column in REPLACED:
        op.create_index(name, TABLE, [column])
    for name, _, _ in SORT_INDEXES:
        op.drop_index(name, table_name=TABLE)
