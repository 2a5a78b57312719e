"""group hours: each failure group's failures counted per hour by the database

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04 08:10:00.000000

Source: docs/design.md "Reads at scale" (a view's cost follows its groups, not their
messages). The groups views show each group's failures per hour over the last day (a
sparkline) and its growth; counting the group rows of that day at read time would cost
as many rows as failed in it (a storm's million).

``failed_message_group_hours`` holds counts per (group id, hour): ``hour`` is whole hours
since 1970-01-01 UTC of a failure's time (``last_failure_at``). A failure is a group row
written with its failure time: the writer replaces a message's group rows whenever it
stores a newer attempt (a first failure, a failure again after a retry), and never for a
duplicate delivery, so each row inserted is one failure. Nothing is subtracted when the
row goes (a failure that happened stays counted in its hour).

- PostgreSQL: a STATEMENT-level trigger appends one row per (group, hour) that an INSERT
  of group rows added, with its count (transition table; the copies are already set by
  migration 0011's row trigger); never an update of a shared row, so writers never wait
  on each other. ``Provider.compact_group_counts`` folds the rows into one per key and
  drops hours older than ``KEPT_HOURS``.
- SQLite (one writer at a time): row-level triggers keep one row per key, adding 1 when
  a group row is inserted with its failure time, or gets it (the copies' fill of 0011),
  and deleting that group's hours older than ``KEPT_HOURS``.

The hours of existing rows are filled from the group rows of the last ``KEPT_HOURS``
(their latest failure only: earlier failures of a message were never kept).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

HOURS = "failed_message_group_hours"
GROUPS = "failed_message_groups"
KEPT_HOURS = 48
"""Hours kept per group: the sparkline's day and the day before it (frozen copy of
``db.tables.GROUP_HOURS_KEPT``: migrations never run live code)."""


def upgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        hour_of = "floor(extract(epoch FROM last_failure_at) / 3600)::bigint"
        since = f"floor(extract(epoch FROM now() AT TIME ZONE 'UTC') / 3600)::bigint - {KEPT_HOURS}"
        # Writers insert group rows; hold them off until the triggers exist.
        op.execute(f"LOCK TABLE {GROUPS} IN SHARE ROW EXCLUSIVE MODE")
    elif dialect == "sqlite":
        hour_of = "CAST(strftime('%s', last_failure_at) AS INTEGER) / 3600"
        since = f"CAST(strftime('%s', 'now') AS INTEGER) / 3600 - {KEPT_HOURS}"
    else:
        unsupported(dialect, revision)
    op.create_table(
        HOURS,
        sa.Column("group_id", sa.String(36), nullable=False),
        sa.Column("hour", sa.BigInteger, nullable=False),
        sa.Column("n", sa.BigInteger, nullable=False),
    )
    op.create_index(f"ix_{HOURS}_group_id_hour", HOURS, ["group_id", "hour"])
    op.create_index(f"ix_{HOURS}_hour", HOURS, ["hour"])
    op.execute(
        f"INSERT INTO {HOURS} (group_id, hour, n) SELECT group_id, {hour_of}, count(*) "
        f"FROM {GROUPS} WHERE last_failure_at IS NOT NULL AND {hour_of} >= {since} "
        f"GROUP BY group_id, {hour_of}"
    )
    if dialect == "postgresql":
        _create_postgresql_trigger()
    else:
        _create_sqlite_triggers()


def downgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        op.execute(f"DROP TRIGGER failed_message_groups_hours_added ON {GROUPS}")
        op.execute("DROP FUNCTION failed_message_groups_hours_added()")
    elif dialect == "sqlite":
        op.execute("DROP TRIGGER failed_message_groups_hours_added")
        op.execute("DROP TRIGGER failed_message_groups_hours_filled")
    else:
        unsupported(dialect, revision)
    op.drop_table(HOURS)


def _create_postgresql_trigger() -> None:
    hour_of = "floor(extract(epoch FROM last_failure_at) / 3600)::bigint"
    op.execute(
        "CREATE FUNCTION failed_message_groups_hours_added() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN "
        f"INSERT INTO {HOURS} (group_id, hour, n) SELECT group_id, {hour_of}, count(*) "
        f"FROM added WHERE last_failure_at IS NOT NULL GROUP BY group_id, {hour_of}; "
        "RETURN NULL; END $$"
    )
    op.execute(
        f"CREATE TRIGGER failed_message_groups_hours_added AFTER INSERT ON {GROUPS} "
        "REFERENCING NEW TABLE AS added FOR EACH STATEMENT "
        "EXECUTE FUNCTION failed_message_groups_hours_added()"
    )


def _sqlite_count(row: str) -> str:
    """Statements adding 1 to the hour of ``row``'s failure, then dropping its group's
    hours older than ``KEPT_HOURS`` before it."""
    hour = f"(CAST(strftime('%s', {row}.last_failure_at) AS INTEGER) / 3600)"
    where = f"group_id = {row}.group_id AND hour = {hour}"
    return (
        f"UPDATE {HOURS} SET n = n + 1 WHERE {where}; "
        f"INSERT INTO {HOURS} (group_id, hour, n) SELECT {row}.group_id, {hour}, 1 "
        f"WHERE NOT EXISTS (SELECT 1 FROM {HOURS} WHERE {where}); "
        f"DELETE FROM {HOURS} WHERE group_id = {row}.group_id "
        f"AND hour < {hour} - {KEPT_HOURS}; "
    )


def _create_sqlite_triggers() -> None:
    op.execute(
        f"CREATE TRIGGER failed_message_groups_hours_added AFTER INSERT ON {GROUPS} "
        f"WHEN new.last_failure_at IS NOT NULL BEGIN {_sqlite_count('new')}END"
    )
    op.execute(
        f"CREATE TRIGGER failed_message_groups_hours_filled "
        f"AFTER UPDATE OF last_failure_at ON {GROUPS} "
        f"WHEN old.last_failure_at IS NULL AND new.last_failure_at IS NOT NULL "
        f"BEGIN {_sqlite_count('new')}END"
    )
