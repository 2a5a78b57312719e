"""read side at a million: group rows carry their message's status and failure window

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 16:30:00.000000

Source: docs/decisions.md "Group rows carry copies of their message" (``benchmarks/query.py``,
``benchmarks/README.md``). At 1,000,000 failed
messages the groups view joined 5,000,000 group rows to the messages for ``status``,
``first_failure_at`` and ``last_failure_at`` (2-3 s per classifier), and a group's count
did the same join for one group (0.9 s for the biggest).

- ``failed_message_groups.status``, ``.first_failure_at``, ``.last_failure_at``: copies
  of the message's columns, kept equal by the database in the transaction that changes
  them (triggers: a group row inserted takes its message's values; a message whose
  status or failure window changes passes them to its group rows). No code path that
  changes a message (ingest, archive, retry, resolve, ...) has to know; the groups views
  read the group rows alone. Never a counter: each row is one message's own values, so
  nothing is shared between writers that a concurrent transaction could lose.
- Indexes that answer those views from the index alone:
  ``(classifier, status, group_id, last_failure_at, first_failure_at)`` for the groups
  of a classifier (and one group's aggregate), and ``(group_id, status,
  failed_message_id)`` in place of ``(group_id)`` for a group's messages and their count.
- ``failed_messages (status, id)``: the list sorted by ``status`` (ServiceControl's sort
  key) read in index order instead of sorting every row.
- PostgreSQL: a statistics target of 1,000 on ``failed_message_groups.group_id`` (default
  100): with more groups than the target, the planner guessed the size of a small group
  at 5,000 of 5,000,000 rows and walked the ``time_sent`` index backwards probing every
  message for it (3-4 s for a group of 219); with the group in the most-common-values
  list it reads the group's ids first.

The copies of existing rows are filled in this migration's transaction: one ``UPDATE``
of every group row (about a minute per million messages on PostgreSQL).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

GROUPS = "failed_message_groups"
COPIED = ("status", "first_failure_at", "last_failure_at")
OLD_GROUP_INDEX = "ix_failed_message_groups_group_id"
CLASSIFIER_INDEX = "ix_failed_message_groups_classifier_status_group_id"
GROUP_INDEX = "ix_failed_message_groups_group_id_status"
STATUS_INDEX = "ix_failed_messages_status_id"
GROUP_ID_STATISTICS = 1000

_FROM_MESSAGE = (
    "(SELECT m.status, m.first_failure_at, m.last_failure_at "
    "FROM failed_messages m WHERE m.id = {row}.failed_message_id)"
)
_CHANGED = " OR ".join(f"old.{c} IS DISTINCT FROM new.{c}" for c in COPIED)
_SQLITE_CHANGED = " OR ".join(f"old.{c} IS NOT new.{c}" for c in COPIED)
_COLUMNS = ", ".join(COPIED)


def upgrade() -> None:
    dialect = migrating(revision)
    op.add_column(GROUPS, sa.Column("status", sa.SmallInteger, nullable=True))
    op.add_column(GROUPS, sa.Column("first_failure_at", sa.DateTime(), nullable=True))
    op.add_column(GROUPS, sa.Column("last_failure_at", sa.DateTime(), nullable=True))
    if dialect == "postgresql":
        op.execute(
            f"UPDATE {GROUPS} g SET ({_COLUMNS}) = (m.status, m.first_failure_at, "
            "m.last_failure_at) FROM failed_messages m WHERE m.id = g.failed_message_id"
        )
        _create_postgresql_triggers()
        op.execute(
            f"ALTER TABLE {GROUPS} ALTER COLUMN group_id SET STATISTICS {GROUP_ID_STATISTICS}"
        )
    elif dialect == "sqlite":
        op.execute(f"UPDATE {GROUPS} SET ({_COLUMNS}) = {_FROM_MESSAGE.format(row=GROUPS)}")
        _create_sqlite_triggers()
    else:
        unsupported(dialect, revision)
    op.drop_index(OLD_GROUP_INDEX, table_name=GROUPS)
    op.create_index(
        CLASSIFIER_INDEX,
        GROUPS,
        ["classifier", "status", "group_id", "last_failure_at", "first_failure_at"],
    )
    op.create_index(GROUP_INDEX, GROUPS, ["group_id", "status", "failed_message_id"])
    op.create_index(STATUS_INDEX, "failed_messages", ["status", "id"])
    if dialect == "postgresql":
        op.execute(f"ANALYZE {GROUPS}")
    elif dialect == "sqlite":
        pass  # SQLite keeps no statistics to refresh
    else:
        unsupported(dialect, revision)


def downgrade() -> None:
    dialect = migrating(revision)
    op.drop_index(STATUS_INDEX, table_name="failed_messages")
    op.drop_index(GROUP_INDEX, table_name=GROUPS)
    op.drop_index(CLASSIFIER_INDEX, table_name=GROUPS)
    op.create_index(OLD_GROUP_INDEX, GROUPS, ["group_id"])
    if dialect == "postgresql":
        op.execute("DROP TRIGGER failed_messages_copy_to_groups ON failed_messages")
        op.execute(f"DROP TRIGGER failed_message_groups_copy_message ON {GROUPS}")
        op.execute("DROP FUNCTION failed_messages_copy_to_groups()")
        op.execute("DROP FUNCTION failed_message_groups_copy_message()")
        op.execute(f"ALTER TABLE {GROUPS} ALTER COLUMN group_id SET STATISTICS -1")
        for column in COPIED:
            op.drop_column(GROUPS, column)
    elif dialect == "sqlite":
        op.execute("DROP TRIGGER failed_messages_copy_to_groups")
        op.execute("DROP TRIGGER failed_message_groups_copy_message")
        with op.batch_alter_table(GROUPS) as batch_op:
            for column in COPIED:
                batch_op.drop_column(column)
    else:
        unsupported(dialect, revision)


def _create_postgresql_triggers() -> None:
    # A BEFORE INSERT trigger fills the new row itself. The writer inserts a message's
    # group rows after its upsert, holding that message's row lock, so the values read
    # here are the ones that commit; a later change of the message waits for that lock
    # and then updates these rows (each statement of a plpgsql function sees the rows
    # committed before it started).
    op.execute(
        "CREATE FUNCTION failed_message_groups_copy_message() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN "
        "SELECT m.status, m.first_failure_at, m.last_failure_at "
        "INTO new.status, new.first_failure_at, new.last_failure_at "
        "FROM failed_messages m WHERE m.id = new.failed_message_id; "
        "RETURN new; END $$"
    )
    op.execute(
        f"CREATE TRIGGER failed_message_groups_copy_message BEFORE INSERT ON {GROUPS} "
        "FOR EACH ROW EXECUTE FUNCTION failed_message_groups_copy_message()"
    )
    op.execute(
        "CREATE FUNCTION failed_messages_copy_to_groups() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN "
        f"UPDATE {GROUPS} SET status = new.status, first_failure_at = new.first_failure_at, "
        "last_failure_at = new.last_failure_at WHERE failed_message_id = new.id; "
        "RETURN NULL; END $$"
    )
    op.execute(
        f"CREATE TRIGGER failed_messages_copy_to_groups AFTER UPDATE OF {_COLUMNS} "
        f"ON failed_messages FOR EACH ROW WHEN ({_CHANGED}) "
        "EXECUTE FUNCTION failed_messages_copy_to_groups()"
    )


def _create_sqlite_triggers() -> None:
    # SQLite cannot change the row a BEFORE trigger sees: the inserted row is updated
    # right after, in the same statement (writes are serialised, BEGIN IMMEDIATE).
    op.execute(
        f"CREATE TRIGGER failed_message_groups_copy_message AFTER INSERT ON {GROUPS} "
        f"BEGIN UPDATE {GROUPS} SET ({_COLUMNS}) = {_FROM_MESSAGE.format(row='new')} "
        f"WHERE rowid = new.rowid; END"
    )
    op.execute(
        f"CREATE TRIGGER failed_messages_copy_to_groups AFTER UPDATE OF {_COLUMNS} "
        f"ON failed_messages WHEN {_SQLITE_CHANGED} "
        f"BEGIN UPDATE {GROUPS} SET status = new.status, "
        "first_failure_at = new.first_failure_at, last_failure_at = new.last_failure_at "
        "WHERE failed_message_id = new.id; END"
    )
