"""subset sort indexes: a group's or an endpoint's page read from its own rows in order

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04 08:00:00.000000

Source: docs/decisions.md "A subset is read from its own rows". A group of 201,683
messages that stopped failing, sorted by ``time_sent`` descending, went from 18 ms to
2,368 ms p95 after 243,000 failures elsewhere: its page walked
``ix_failed_messages_time_sent_id`` through every newer message, probing the group rows
for each. The cost of a subset's page must not grow with rows outside the subset.

- ``failed_message_groups.time_sent``, ``.last_modified``, ``.message_type``,
  ``.message_id``: copies of the message's columns beside migration 0011's (every sort
  key of a group's page is then on its group rows), kept equal the same way (the writer inserts
  them read from the message, the insert trigger fills a row inserted without them, the
  update trigger passes a change on).
- ``(group_id, <key>, failed_message_id)`` for ServicePulse's two sorts, ``time_sent``
  (its default) and ``last_failure_at`` (``time_of_failure``): a group's page in either
  direction walks its own rows in order.
- ``(receiving_endpoint, <key>, id)`` and ``(lower(queue_address), <key>, id)`` on
  ``failed_messages`` for the same keys: an endpoint's or a queue's page likewise. They
  replace the single-column indexes on those columns, which they cover.

Other sort keys of a subset read the subset's rows and sort them (a fence,
``Provider.materialized_cte``): bounded by the subset, never by rows outside it. Every
index more is paid on every write: with the last-modified and message-type indexes too
the write path cost 15 % more CPU per message than at 0019 (``benchmarks/copies.py``),
over the tenth the read side may take.
PostgreSQL puts empty values last ascending unless told, so its indexes of the nullable
columns say ``NULLS FIRST`` (as migration 0004's).

The copies of existing rows are filled in this migration's transaction: one ``UPDATE`` of
every group row.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import Dialect, migrating, unsupported

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

GROUPS = "failed_message_groups"
MESSAGES = "failed_messages"
INSERT_TRIGGER = "failed_message_groups_copy_message"
UPDATE_TRIGGER = "failed_messages_copy_to_groups"
OLD_COPIES = ("status", "first_failure_at", "last_failure_at")
NEW_COPIES = ("time_sent", "last_modified", "message_type", "message_id")
# (sort column, nullable): the keys a subset's page walks an index of.
GROUP_SORTS = (("time_sent", True), ("last_failure_at", False))
SUBSET_SORTS = GROUP_SORTS
# (the replaced single-column index, which names the new ones, the subset's column)
SUBSETS = (
    ("ix_failed_messages_receiving_endpoint", "receiving_endpoint"),
    ("ix_failed_messages_queue_address_lower", "lower(queue_address)"),
)


def _copies_sql(copies: tuple[str, ...], row: str) -> str:
    return f"(SELECT {', '.join(f'm.{c}' for c in copies)} FROM {MESSAGES} m WHERE m.id = {row})"


def upgrade() -> None:
    dialect = migrating(revision)
    op.add_column(GROUPS, sa.Column("time_sent", sa.DateTime(), nullable=True))
    op.add_column(GROUPS, sa.Column("last_modified", sa.DateTime(), nullable=True))
    op.add_column(GROUPS, sa.Column("message_type", sa.Text, nullable=True))
    op.add_column(GROUPS, sa.Column("message_id", sa.String(400), nullable=True))
    _fill_copies(dialect, NEW_COPIES)
    _drop_triggers(dialect)
    _create_triggers(dialect, OLD_COPIES + NEW_COPIES)
    for column, nullable in GROUP_SORTS:
        op.create_index(
            f"ix_{GROUPS}_group_id_{column}",
            GROUPS,
            ["group_id", _leading(dialect, column, nullable), "failed_message_id"],
        )
    for name, subset in SUBSETS:
        for column, nullable in SUBSET_SORTS:
            op.create_index(
                f"{name}_{column}",
                MESSAGES,
                [sa.text(subset), _leading(dialect, column, nullable), "id"],
            )
        op.drop_index(name, table_name=MESSAGES)
    _analyze(dialect)


def downgrade() -> None:
    dialect = migrating(revision)
    for name, subset in SUBSETS:
        op.create_index(name, MESSAGES, [sa.text(subset)])
        for column, _nullable in SUBSET_SORTS:
            op.drop_index(f"{name}_{column}", table_name=MESSAGES)
    for column, _nullable in GROUP_SORTS:
        op.drop_index(f"ix_{GROUPS}_group_id_{column}", table_name=GROUPS)
    _drop_triggers(dialect)
    if dialect == "postgresql":
        for column in NEW_COPIES:
            op.drop_column(GROUPS, column)
    elif dialect == "sqlite":
        # In place (SQLite 3.35+): a copy of the table would lose its other triggers (0014).
        for column in NEW_COPIES:
            op.execute(f"ALTER TABLE {GROUPS} DROP COLUMN {column}")
    else:
        unsupported(dialect, revision)
    _create_triggers(dialect, OLD_COPIES)


def _leading(dialect: Dialect, column: str, nullable: bool) -> sa.TextClause | str:
    """The index element of sort ``column``: empty values first ascending, as the
    list orders them (migration 0004)."""
    if dialect == "postgresql":
        return sa.text(f"{column} NULLS FIRST") if nullable else column
    if dialect == "sqlite":
        return column  # SQLite sorts NULLs first in ascending order already
    unsupported(dialect, revision)


def _fill_copies(dialect: Dialect, copies: tuple[str, ...]) -> None:
    columns = ", ".join(copies)
    if dialect == "postgresql":
        op.execute(
            f"UPDATE {GROUPS} g SET ({columns}) = ({', '.join(f'm.{c}' for c in copies)}) "
            f"FROM {MESSAGES} m WHERE m.id = g.failed_message_id"
        )
    elif dialect == "sqlite":
        from_message = _copies_sql(copies, f"{GROUPS}.failed_message_id")
        op.execute(f"UPDATE {GROUPS} SET ({columns}) = {from_message}")
    else:
        unsupported(dialect, revision)


def _create_triggers(dialect: Dialect, copies: tuple[str, ...]) -> None:
    """Migration 0011's triggers (with 0013's ``WHEN`` on insert) over ``copies``: a group
    row inserted without its copies takes them from its message (the non-null copies
    tell: ``status``, the failure window), a change of a message passes them on."""
    columns = ", ".join(copies)
    missing = " OR ".join(f"new.{c} IS NULL" for c in OLD_COPIES)
    if dialect == "postgresql":
        op.execute(
            f"CREATE OR REPLACE FUNCTION {INSERT_TRIGGER}() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN "
            f"SELECT {', '.join(f'm.{c}' for c in copies)} "
            f"INTO {', '.join(f'new.{c}' for c in copies)} "
            f"FROM {MESSAGES} m WHERE m.id = new.failed_message_id; "
            "RETURN new; END $$"
        )
        op.execute(
            f"CREATE TRIGGER {INSERT_TRIGGER} BEFORE INSERT ON {GROUPS} FOR EACH ROW "
            f"WHEN ({missing}) EXECUTE FUNCTION {INSERT_TRIGGER}()"
        )
        op.execute(
            f"CREATE OR REPLACE FUNCTION {UPDATE_TRIGGER}() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN "
            f"UPDATE {GROUPS} SET {', '.join(f'{c} = new.{c}' for c in copies)} "
            "WHERE failed_message_id = new.id; RETURN NULL; END $$"
        )
        changed = " OR ".join(f"old.{c} IS DISTINCT FROM new.{c}" for c in copies)
        op.execute(
            f"CREATE TRIGGER {UPDATE_TRIGGER} AFTER UPDATE OF {columns} ON {MESSAGES} "
            f"FOR EACH ROW WHEN ({changed}) EXECUTE FUNCTION {UPDATE_TRIGGER}()"
        )
    elif dialect == "sqlite":
        op.execute(
            f"CREATE TRIGGER {INSERT_TRIGGER} AFTER INSERT ON {GROUPS} WHEN ({missing}) "
            f"BEGIN UPDATE {GROUPS} SET ({columns}) = "
            f"{_copies_sql(copies, 'new.failed_message_id')} WHERE rowid = new.rowid; END"
        )
        changed = " OR ".join(f"old.{c} IS NOT new.{c}" for c in copies)
        op.execute(
            f"CREATE TRIGGER {UPDATE_TRIGGER} AFTER UPDATE OF {columns} ON {MESSAGES} "
            f"WHEN {changed} BEGIN UPDATE {GROUPS} SET "
            f"{', '.join(f'{c} = new.{c}' for c in copies)} WHERE failed_message_id = new.id; END"
        )
    else:
        unsupported(dialect, revision)


def _drop_triggers(dialect: Dialect) -> None:
    """Drops the copy triggers (their functions stay on PostgreSQL, replaced by
    ``_create_triggers``)."""
    if dialect == "postgresql":
        op.execute(f"DROP TRIGGER {INSERT_TRIGGER} ON {GROUPS}")
        op.execute(f"DROP TRIGGER {UPDATE_TRIGGER} ON {MESSAGES}")
    elif dialect == "sqlite":
        op.execute(f"DROP TRIGGER {INSERT_TRIGGER}")
        op.execute(f"DROP TRIGGER {UPDATE_TRIGGER}")
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
