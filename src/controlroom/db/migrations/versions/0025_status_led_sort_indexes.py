"""status-led sort indexes: a status's page read from its own rows in order

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04 11:40:00.000000

Source: docs/decisions.md "A subset is read from its own rows". A list filtered by
status alone walked the sort key's index of every message and tested each row's status:
the resolved messages, old, behind thousands of newer unresolved ones (or the few still
unresolved behind many newer resolved ones) cost a walk through all of those.

``(status, <key>, id)`` for ``time_sent``, ``last_failure_at`` and ``message_type``
REPLACE ``(<key>, id)`` (migration 0004): as many indexes as before, each entry two bytes
wider, so the write path pays nearly what it paid. A list over several statuses (or all)
merges one ordered read per status (the statuses are four). Nullable keys are indexed
``NULLS FIRST`` on PostgreSQL, as the list orders them (migration 0004).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import Dialect, migrating, unsupported

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

MESSAGES = "failed_messages"
# (sort column, nullable)
KEYS = (("time_sent", True), ("last_failure_at", False), ("message_type", True))


def upgrade() -> None:
    dialect = migrating(revision)
    for column, nullable in KEYS:
        op.create_index(
            f"ix_{MESSAGES}_status_{column}_id",
            MESSAGES,
            ["status", _leading(dialect, column, nullable), "id"],
        )
        op.drop_index(f"ix_{MESSAGES}_{column}_id", table_name=MESSAGES)
    _analyze(dialect)


def downgrade() -> None:
    dialect = migrating(revision)
    for column, nullable in KEYS:
        op.create_index(
            f"ix_{MESSAGES}_{column}_id", MESSAGES, [_leading(dialect, column, nullable), "id"]
        )
        op.drop_index(f"ix_{MESSAGES}_status_{column}_id", table_name=MESSAGES)
    _analyze(dialect)


def _leading(dialect: Dialect, column: str, nullable: bool) -> sa.TextClause | str:
    """The index element of sort ``column``: empty values first ascending."""
    if dialect == "postgresql":
        return sa.text(f"{column} NULLS FIRST") if nullable else column
    if dialect == "sqlite":
        return column  # SQLite sorts NULLs first in ascending order already
    unsupported(dialect, revision)


def _analyze(dialect: Dialect) -> None:
    if dialect == "postgresql":
        op.execute(f"ANALYZE {MESSAGES}")
    elif dialect == "sqlite":
        pass  # SQLite keeps no statistics to refresh
    else:
        unsupported(dialect, revision)
