"""group counts: each failure group's messages counted per status by the database

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 20:30:00.000000

Source: docs/decisions.md "The database keeps the counts" (``benchmarks/query.py``). With the copies
of migration 0011 the groups view still counted every group row of a classifier in the viewed status
(700,000 index entries at 1,000,000 failed messages: 0.5-0.8 s under load); a group by id counted
the group's rows (0.4 s for the biggest).

``failed_message_group_counts`` holds signed counts per (classifier, group id, status);
a group's count in a status is the SUM of its rows, exactly the number of its group rows
in that status at every committed state:

- PostgreSQL: STATEMENT-level triggers append one row per (classifier, group, status)
  that a statement changed, with the statement's net change (transition tables): group
  rows inserted (+), deleted (-, also by the cascade of a deleted message), and messages
  whose status changed (- old, + new, for each of their group rows); a TRUNCATE of the
  group rows empties the counts. Appending never
  updates a shared row, so two writers never wait for each other or deadlock on a
  counter; ``Provider.compact_group_counts`` folds the rows into one per key, with the
  tallies' deltas of migration 0012 (``errors.tallies.fold_deltas``).
- SQLite (one writer at a time): row-level triggers keep one row per key, updated in
  place, deleted when it reaches 0. They count a group row when its status is set:
  the insert trigger of 0011 fills the copies by an UPDATE right after the INSERT.

The counts of existing rows are filled in this migration's transaction, with both tables
locked against writes (PostgreSQL) until the commit.

The groups views read the counts, and each group's first and last failure from two index
probes: ``(classifier, status, group_id, last_failure_at, ...)`` (0011) for the latest
last failure, and ``(group_id, status, first_failure_at, failed_message_id)`` (replacing
0011's ``(group_id, status, failed_message_id)``, which served a group's member ids and
its count by status, as this one still does) for the earliest first failure.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

COUNTS = "failed_message_group_counts"
GROUPS = "failed_message_groups"
OLD_GROUP_INDEX = "ix_failed_message_groups_group_id_status"
GROUP_INDEX = "ix_failed_message_groups_group_id_status_first"
_KEY = "classifier, group_id, status"


def upgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        # Writers take the messages, then their group rows; lock both in that order until
        # the commit, so no write falls between the fill and the triggers and creating
        # the triggers cannot deadlock with a writer (break-it pass: off-by-one counts,
        # deadlocks, upgrading under live writers).
        op.execute(f"LOCK TABLE failed_messages, {GROUPS} IN SHARE ROW EXCLUSIVE MODE")
    elif dialect == "sqlite":
        pass  # one writer at a time: the migration holds the write lock to its commit
    else:
        unsupported(dialect, revision)
    op.create_table(
        COUNTS,
        sa.Column("classifier", sa.String(100), nullable=False),
        sa.Column("group_id", sa.String(36), nullable=False),
        sa.Column("status", sa.SmallInteger, nullable=False),
        sa.Column("n", sa.BigInteger, nullable=False),
    )
    op.create_index(f"ix_{COUNTS}_classifier_status", COUNTS, ["classifier", "status", "group_id"])
    op.create_index(f"ix_{COUNTS}_group_id_status", COUNTS, ["group_id", "status"])
    op.execute(
        f"INSERT INTO {COUNTS} ({_KEY}, n) SELECT {_KEY}, count(*) FROM {GROUPS} "
        f"WHERE status IS NOT NULL GROUP BY {_KEY}"
    )
    if dialect == "postgresql":
        _create_postgresql_triggers()
    elif dialect == "sqlite":
        _create_sqlite_triggers()
    else:
        unsupported(dialect, revision)
    op.drop_index(OLD_GROUP_INDEX, table_name=GROUPS)
    op.create_index(
        GROUP_INDEX, GROUPS, ["group_id", "status", "first_failure_at", "failed_message_id"]
    )


def downgrade() -> None:
    dialect = migrating(revision)
    op.drop_index(GROUP_INDEX, table_name=GROUPS)
    op.create_index(OLD_GROUP_INDEX, GROUPS, ["group_id", "status", "failed_message_id"])
    if dialect == "postgresql":
        op.execute(f"DROP TRIGGER failed_message_groups_count_added ON {GROUPS}")
        op.execute(f"DROP TRIGGER failed_message_groups_count_removed ON {GROUPS}")
        op.execute(f"DROP TRIGGER failed_message_groups_count_truncate ON {GROUPS}")
        op.execute("DROP TRIGGER failed_messages_count_status ON failed_messages")
        op.execute("DROP FUNCTION failed_message_groups_count_added()")
        op.execute("DROP FUNCTION failed_message_groups_count_removed()")
        op.execute("DROP FUNCTION failed_message_groups_count_truncate()")
        op.execute("DROP FUNCTION failed_messages_count_status()")
    elif dialect == "sqlite":
        for trigger in ("added", "removed", "status"):
            op.execute(f"DROP TRIGGER failed_message_groups_count_{trigger}")
    else:
        unsupported(dialect, revision)
    op.drop_table(COUNTS)


def _create_postgresql_triggers() -> None:
    op.execute(
        "CREATE FUNCTION failed_message_groups_count_added() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN "
        f"INSERT INTO {COUNTS} ({_KEY}, n) SELECT {_KEY}, count(*) FROM added "
        f"GROUP BY {_KEY}; RETURN NULL; END $$"
    )
    op.execute(
        f"CREATE TRIGGER failed_message_groups_count_added AFTER INSERT ON {GROUPS} "
        "REFERENCING NEW TABLE AS added FOR EACH STATEMENT "
        "EXECUTE FUNCTION failed_message_groups_count_added()"
    )
    op.execute(
        "CREATE FUNCTION failed_message_groups_count_removed() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN "
        f"INSERT INTO {COUNTS} ({_KEY}, n) SELECT {_KEY}, -count(*) FROM removed "
        f"GROUP BY {_KEY}; RETURN NULL; END $$"
    )
    op.execute(
        f"CREATE TRIGGER failed_message_groups_count_removed AFTER DELETE ON {GROUPS} "
        "REFERENCING OLD TABLE AS removed FOR EACH STATEMENT "
        "EXECUTE FUNCTION failed_message_groups_count_removed()"
    )
    # TRUNCATE fires no row or statement delete trigger: it waits for every writer of the
    # group rows to finish, and what is left to count is nothing.
    op.execute(
        "CREATE FUNCTION failed_message_groups_count_truncate() RETURNS trigger "
        f"LANGUAGE plpgsql AS $$ BEGIN DELETE FROM {COUNTS}; RETURN NULL; END $$"
    )
    op.execute(
        f"CREATE TRIGGER failed_message_groups_count_truncate AFTER TRUNCATE ON {GROUPS} "
        "FOR EACH STATEMENT EXECUTE FUNCTION failed_message_groups_count_truncate()"
    )
    # Only messages whose status changed reach the group rows; a statement that changed
    # none (most of the writer's upserts) costs a join of its own rows.
    op.execute(
        "CREATE FUNCTION failed_messages_count_status() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN "
        f"INSERT INTO {COUNTS} ({_KEY}, n) "
        "SELECT g.classifier, g.group_id, c.status, sum(c.n) FROM ("
        "SELECT a.id, a.status, 1 AS n FROM after a JOIN before b ON b.id = a.id "
        "WHERE a.status <> b.status "
        "UNION ALL SELECT b.id, b.status, -1 FROM after a JOIN before b ON b.id = a.id "
        "WHERE a.status <> b.status) c "
        f"JOIN {GROUPS} g ON g.failed_message_id = c.id "
        "GROUP BY g.classifier, g.group_id, c.status HAVING sum(c.n) <> 0; "
        "RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER failed_messages_count_status AFTER UPDATE ON failed_messages "
        "REFERENCING OLD TABLE AS before NEW TABLE AS after FOR EACH STATEMENT "
        "EXECUTE FUNCTION failed_messages_count_status()"
    )


def _sqlite_add(row: str, sign: str) -> str:
    """Statements adding ``sign`` 1 to the count of ``row``'s key (one row per key),
    nothing when ``row`` has no status yet."""
    where = f"classifier = {row}.classifier AND group_id = {row}.group_id AND status = {row}.status"
    return (
        f"UPDATE {COUNTS} SET n = n {sign} 1 WHERE {where}; "
        f"INSERT INTO {COUNTS} ({_KEY}, n) SELECT {row}.classifier, {row}.group_id, "
        f"{row}.status, {sign}1 WHERE {row}.status IS NOT NULL "
        f"AND NOT EXISTS (SELECT 1 FROM {COUNTS} WHERE {where}); "
        f"DELETE FROM {COUNTS} WHERE {where} AND n = 0; "
    )


def _create_sqlite_triggers() -> None:
    op.execute(
        f"CREATE TRIGGER failed_message_groups_count_added AFTER INSERT ON {GROUPS} "
        f"BEGIN {_sqlite_add('new', '+')}END"
    )
    op.execute(
        f"CREATE TRIGGER failed_message_groups_count_removed AFTER DELETE ON {GROUPS} "
        f"BEGIN {_sqlite_add('old', '-')}END"
    )
    op.execute(
        f"CREATE TRIGGER failed_message_groups_count_status AFTER UPDATE OF status ON {GROUPS} "
        f"WHEN old.status IS NOT new.status "
        f"BEGIN {_sqlite_add('old', '-')}{_sqlite_add('new', '+')}END"
    )
