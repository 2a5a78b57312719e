"""group hours on SQLite: a failure's hour from its whole seconds, the kept hours from now

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-06 18:00:00.000000

Source: migration 0022 (each failure group's failures counted per hour by the database).

SQLite's triggers took a failure's hour from ``strftime('%s', last_failure_at)``, which
rounds the stored microseconds to the millisecond first: a failure at
``00:59:59.9995`` counted in the next hour, and one at ``9999-12-31 23:59:59.9995``
or later had no hour at all (past SQLite's last year), so the trigger's insert failed,
and with it every batch that held that message, for ever. The hour is now read from the
stored time's whole seconds (``YYYY-MM-DD HH:MM:SS``, its first 19 characters), as
PostgreSQL's ``floor(extract(epoch ...) / 3600)`` takes it.

The triggers also dropped a group's hours older than ``KEPT_HOURS`` before the failure
just counted: one failure stamped far ahead (a sender's clock) dropped the group's
present hours. They now drop those older than ``KEPT_HOURS`` before the earlier of that
hour and the present one, as PostgreSQL's fold drops by the present. Nothing changes on
PostgreSQL.
"""

from __future__ import annotations

from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None

HOURS = "failed_message_group_hours"
GROUPS = "failed_message_groups"
KEPT_HOURS = 48  # migration 0022's


def upgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        return
    elif dialect == "sqlite":
        hour = "(CAST(strftime('%s', substr(new.last_failure_at, 1, 19)) AS INTEGER) / 3600)"
        now = "(CAST(strftime('%s', 'now') AS INTEGER) / 3600)"
        _replace_triggers(hour, f"min({hour}, {now})")
    else:
        unsupported(dialect, revision)


def downgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        return
    elif dialect == "sqlite":
        hour = "(CAST(strftime('%s', new.last_failure_at) AS INTEGER) / 3600)"
        _replace_triggers(hour, hour)
    else:
        unsupported(dialect, revision)


def _replace_triggers(hour: str, kept_from: str) -> None:
    """Migration 0022's two SQLite triggers, each adding 1 to the group's count of
    ``hour`` and dropping its hours older than ``KEPT_HOURS`` before ``kept_from``."""
    where = f"group_id = new.group_id AND hour = {hour}"
    count = (
        f"UPDATE {HOURS} SET n = n + 1 WHERE {where}; "
        f"INSERT INTO {HOURS} (group_id, hour, n) SELECT new.group_id, {hour}, 1 "
        f"WHERE NOT EXISTS (SELECT 1 FROM {HOURS} WHERE {where}); "
        f"DELETE FROM {HOURS} WHERE group_id = new.group_id "
        f"AND hour < {kept_from} - {KEPT_HOURS}; "
    )
    op.execute("DROP TRIGGER failed_message_groups_hours_added")
    op.execute("DROP TRIGGER failed_message_groups_hours_filled")
    op.execute(
        f"CREATE TRIGGER failed_message_groups_hours_added AFTER INSERT ON {GROUPS} "
        f"WHEN new.last_failure_at IS NOT NULL BEGIN {count}END"
    )
    op.execute(
        f"CREATE TRIGGER failed_message_groups_hours_filled "
        f"AFTER UPDATE OF last_failure_at ON {GROUPS} "
        f"WHEN old.last_failure_at IS NULL AND new.last_failure_at IS NOT NULL "
        f"BEGIN {count}END"
    )
