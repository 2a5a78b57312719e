"""a group's page by message type, and a queue address's count, read from their own rows

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-04 17:00:00.000000

Source: docs/decisions.md "A subset is read from its own rows" (figures in
``benchmarks/README.md`` "``stopped.py``").

- ``(group_id, message_type, failed_message_id)`` on the group rows: ServicePulse sorts a
  group's messages by time of failure or by message type; the first was indexed (0020),
  the second read the whole group and sorted it (a 200,000-message group: every row for
  a page of 50). A message's type never changes, so the index adds an entry per group row
  written and no update that was HOT stops being HOT (an index of ``last_modified``
  would). ``NULLS FIRST`` on PostgreSQL, as the list orders an empty type.
- ``ix_failed_messages_queue_address_lower_time_sent`` rebuilt with ``INCLUDE
  (queue_address)`` on PostgreSQL: an exact count of a queue address's messages, once
  ``VACUUM`` had marked the pages all-visible, was an index-only scan of the plain
  ``queue_address`` index whole (every message, filtered by ``lower()``), since an index of
  ``lower(queue_address)`` alone cannot answer ``lower(queue_address)`` without the row.
  With the address in the index, the count reads the address's own range only. SQLite
  answers it from the expression index already and has no ``INCLUDE``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import Dialect, migrating, unsupported

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

GROUPS = "failed_message_groups"
MESSAGES = "failed_messages"
GROUP_INDEX = f"ix_{GROUPS}_group_id_message_type"
QUEUE_INDEX = "ix_failed_messages_queue_address_lower_time_sent"


def upgrade() -> None:
    dialect = migrating(revision)
    op.create_index(GROUP_INDEX, GROUPS, ["group_id", _message_type(dialect), "failed_message_id"])
    _queue_index(dialect, include=True)
    _analyze(dialect)


def downgrade() -> None:
    dialect = migrating(revision)
    op.drop_index(GROUP_INDEX, table_name=GROUPS)
    _queue_index(dialect, include=False)
    _analyze(dialect)


def _message_type(dialect: Dialect) -> sa.TextClause | str:
    """The index element of the message type: empty values first ascending."""
    if dialect == "postgresql":
        return sa.text("message_type NULLS FIRST")
    if dialect == "sqlite":
        return "message_type"  # SQLite sorts NULLs first in ascending order already
    unsupported(dialect, revision)


def _queue_index(dialect: Dialect, *, include: bool) -> None:
    """Rebuilds migration 0020's ``(lower(queue_address), time_sent, id)`` index on
    PostgreSQL, with the address itself included when ``include``."""
    if dialect == "postgresql":
        op.drop_index(QUEUE_INDEX, table_name=MESSAGES)
        op.create_index(
            QUEUE_INDEX,
            MESSAGES,
            [sa.text("lower(queue_address)"), sa.text("time_sent NULLS FIRST"), "id"],
            postgresql_include=["queue_address"] if include else [],
        )
    elif dialect == "sqlite":
        pass  # no INCLUDE; SQLite reads lower(queue_address) from the expression index
    else:
        unsupported(dialect, revision)


def _analyze(dialect: Dialect) -> None:
    if dialect == "postgresql":
        op.execute(f"ANALYZE {GROUPS}")
        op.execute(f"ANALYZE {MESSAGES}")
    elif dialect == "sqlite":
        pass  # SQLite keeps no statistics to refresh
    else:
        unsupported(dialect, revision)
