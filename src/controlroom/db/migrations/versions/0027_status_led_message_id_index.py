"""status-led message-id index: a status's page by message id read from its own rows

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-04 14:10:00.000000

Source: docs/decisions.md "A subset is read from its own rows". Migration 0025 indexed
the time keys and the message type after the status; a list filtered by status and
sorted by message id still walked ``ix_failed_messages_message_id`` through every
message, testing each row's status.

``(status, message_id, id)`` REPLACES ``(message_id)`` (migration 0001): as many indexes
as before, each entry wider by the status and the id (the sort's tie-break). A list of
several statuses, or of all of them, by message id merges one walk per status, as the
other status-led keys do; a lookup by message id names every status
(``errors.read.filters.message_id_is``) and seeks each one's range of the index, four
seeks instead of one. ``message_id`` is never empty: no ``NULLS FIRST`` to state.
"""

from __future__ import annotations

from alembic import op

from controlroom.db.migrations._dialects import Dialect, migrating, unsupported

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

MESSAGES = "failed_messages"
OLD = "ix_failed_messages_message_id"
NEW = "ix_failed_messages_status_message_id_id"


def upgrade() -> None:
    dialect = migrating(revision)
    op.create_index(NEW, MESSAGES, ["status", "message_id", "id"])
    op.drop_index(OLD, table_name=MESSAGES)
    _analyze(dialect)


def downgrade() -> None:
    dialect = migrating(revision)
    op.create_index(OLD, MESSAGES, ["message_id"])
    op.drop_index(NEW, table_name=MESSAGES)
    _analyze(dialect)


def _analyze(dialect: Dialect) -> None:
    if dialect == "postgresql":
        op.execute(f"ANALYZE {MESSAGES}")
    elif dialect == "sqlite":
        pass  # SQLite keeps no statistics to refresh
    else:
        unsupported(dialect, revision)
