"""group counts planned per statement: the status trigger's query is planned on each call

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01 23:00:00.000000

Source: the test suite's doubling (a retry of 2,500 messages took 17 s instead of 8 s
on PostgreSQL). Migration 0014's ``failed_messages_count_status`` runs a static SQL
statement, which ``plpgsql`` plans once per connection, at its first call, and keeps:
planned for the writer's upserts on a fresh database (a few rows in the transition
tables, no group rows yet), the plan nested-looped over both transition tables and over
every group row, and a later bulk status change of 1,000 messages spent seconds in it
(about 1,000 x 1,000 transition-table pairs and 2,000 scans of the group rows). Run by
``EXECUTE``, the same statement is planned on each call, with the transition tables'
row counts and the group rows' current size: hash joins and the primary-key index, a
fraction of a millisecond of planning per statement (the trigger is statement-level).

PostgreSQL only (SQLite's group-count triggers are row-level and hold no plan).
"""

from __future__ import annotations

from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

GROUPS = "failed_message_groups"
COUNTS = "failed_message_group_counts"
# Migration 0014's statement, unchanged: the net change per (classifier, group, status)
# of the messages whose status the statement changed.
_COUNT_STATUS = (
    f"INSERT INTO {COUNTS} (classifier, group_id, status, n) "
    "SELECT g.classifier, g.group_id, c.status, sum(c.n) FROM ("
    "SELECT a.id, a.status, 1 AS n FROM after a JOIN before b ON b.id = a.id "
    "WHERE a.status <> b.status "
    "UNION ALL SELECT b.id, b.status, -1 FROM after a JOIN before b ON b.id = a.id "
    "WHERE a.status <> b.status) c "
    f"JOIN {GROUPS} g ON g.failed_message_id = c.id "
    "GROUP BY g.classifier, g.group_id, c.status HAVING sum(c.n) <> 0"
)


def _replace_function(body: str) -> None:
    op.execute(
        "CREATE OR REPLACE FUNCTION failed_messages_count_status() RETURNS trigger "
        f"LANGUAGE plpgsql AS $$ BEGIN {body}; RETURN NULL; END $$"
    )


def upgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        # EXECUTE sees the trigger's transition tables as a static statement does.
        _replace_function(f"EXECUTE $statement$ {_COUNT_STATUS} $statement$")
    elif dialect == "sqlite":
        pass  # SQLite's row triggers plan no statement ahead
    else:
        unsupported(dialect, revision)


def downgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        _replace_function(_COUNT_STATUS)
    elif dialect == "sqlite":
        pass
    else:
        unsupported(dialect, revision)
