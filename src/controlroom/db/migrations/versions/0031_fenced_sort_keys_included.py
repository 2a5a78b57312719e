"""a subset's fenced sorts read their keys from the index the subset is read by

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-04 21:30:00.000000

Source: docs/decisions.md "A subset is read from its own rows" (figures in
``benchmarks/README.md`` "``stopped.py``").

A subset's sorts no index walks (the console's ``modified``; an endpoint's or a queue
address's ``message_type``, ``status`` and id; a group's ``status`` and id) read the
subset fenced in a materialized CTE and sort it: every row of the subset read from the
table's pages (a bitmap heap scan) for two or three columns of it. On PostgreSQL the
indexes the subset is read by are rebuilt with those columns included (``INCLUDE``: no
new index, no new entry, wider entries), so once ``VACUUM`` has marked the pages
all-visible the fence is an index-only scan of the subset's range:

- ``ix_failed_message_groups_group_id_status_first`` (migration 0014) ``INCLUDE
  (last_modified)``: a group's rows, with or without a status, by ``modified``
  (``status`` and the message's id are in its key already).
- ``ix_failed_messages_receiving_endpoint_time_sent`` and
  ``ix_failed_messages_queue_address_lower_time_sent`` (migrations 0020, 0029)
  ``INCLUDE (last_modified, status)`` (the queue address's keeps
  ``queue_address`` first).

Not ``message_type``: a message type is as long as its producer makes it, and an entry
holding a long endpoint name or queue address beside a long message type passed
PostgreSQL's limit of an index entry (2,704 bytes), which would fail every batch holding
such a message; an endpoint's or a queue address's ``message_type`` sort stays a read of
the subset's rows. No update that was HOT stops being one: ``status`` is in indexes of
both tables already, and a message's ``last_modified`` changes with its status or its
``last_failure_at`` (indexed after the group, the endpoint and the queue address).
SQLite has no ``INCLUDE``; its indexes are left as they are.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import Dialect, migrating, unsupported

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

GROUPS = "failed_message_groups"
MESSAGES = "failed_messages"
GROUP_INDEX = f"ix_{GROUPS}_group_id_status_first"
ENDPOINT_INDEX = "ix_failed_messages_receiving_endpoint_time_sent"
QUEUE_INDEX = "ix_failed_messages_queue_address_lower_time_sent"
FENCED_KEYS = ["last_modified", "status"]
# (index, table, key elements, included before 0031, included since 0031)
INDEXES: tuple[tuple[str, str, list[str | sa.TextClause], list[str], list[str]], ...] = (
    (
        GROUP_INDEX,
        GROUPS,
        ["group_id", "status", "first_failure_at", "failed_message_id"],
        [],
        ["last_modified"],
    ),
    (
        ENDPOINT_INDEX,
        MESSAGES,
        ["receiving_endpoint", sa.text("time_sent NULLS FIRST"), "id"],
        [],
        FENCED_KEYS,
    ),
    (
        QUEUE_INDEX,
        MESSAGES,
        [sa.text("lower(queue_address)"), sa.text("time_sent NULLS FIRST"), "id"],
        ["queue_address"],
        ["queue_address", *FENCED_KEYS],
    ),
)


def upgrade() -> None:
    dialect = migrating(revision)
    _rebuild(dialect, upgraded=True)


def downgrade() -> None:
    dialect = migrating(revision)
    _rebuild(dialect, upgraded=False)


def _rebuild(dialect: Dialect, *, upgraded: bool) -> None:
    """Rebuilds ``INDEXES`` on PostgreSQL with the columns they include since this
    revision when ``upgraded``, else with those they included before it."""
    if dialect == "postgresql":
        for name, table, elements, before, since in INDEXES:
            op.drop_index(name, table_name=table)
            op.create_index(name, table, elements, postgresql_include=since if upgraded else before)
        op.execute(f"ANALYZE {GROUPS}")
        op.execute(f"ANALYZE {MESSAGES}")
    elif dialect == "sqlite":
        pass  # no INCLUDE; SQLite's fenced sorts read the rows, as before
    else:
        unsupported(dialect, revision)
