"""failed message tallies: counts by status and facet kept by the database

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 20:00:00.000000

Source: docs/decisions.md "The database keeps the counts" (``benchmarks/README.md``). At 1,000,000
failed messages the summary (Unresolved messages counted by endpoint, host and message type:
ServiceControl's ``FailedMessageFacetsIndex``) took about 2 s and the counts by status about 200 ms,
each grouping every row. Counters are allowed if they equal the query-time aggregate at every
committed state, whatever code changes a message, under concurrent writers.

- ``failed_message_tallies``: how many failed messages share a key (``status``,
  ``is_system_message``, ``receiving_endpoint``, ``receiving_host_id``,
  ``receiving_host``, ``message_type``); a few thousand rows where the messages are
  millions. The key's nullable columns are unique through ``coalesce`` and ``IS NULL``
  pairs, so NULL is one value (it is one group in ``GROUP BY``) on every provider and
  never confused with an empty string.
- ``failed_message_tally_deltas``: changes of those counts not yet folded into the
  tallies (PostgreSQL). A key's count is its tally plus its deltas.
- Triggers on ``failed_messages`` keep them, in the transaction that changes a message:
  - PostgreSQL: statement-level ``AFTER INSERT/UPDATE/DELETE`` triggers read the
    statement's transition tables and append one delta row per key whose count changed
    (the net change: a key moved away from and back to in one statement writes nothing).
    Writers only ever insert delta rows, so two writers never wait on a shared counter
    row nor deadlock on one. ``Provider.compact_tallies`` folds the deltas into the
    tallies (one statement: the deltas deleted are the ones added) under a
    transaction-level advisory lock that a second compactor skips rather than waits
    for. ``TRUNCATE failed_messages`` empties both.
  - SQLite (one writer at a time, ``BEGIN IMMEDIATE``): row-level triggers add to and
    subtract from the tallies themselves; its deltas table stays empty.

The tallies of existing rows are filled in this migration's transaction, after the
triggers exist: on PostgreSQL creating them locks ``failed_messages`` against writes
until the commit, so no change falls between the fill and the triggers.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TALLIES = "failed_message_tallies"
DELTAS = "failed_message_tally_deltas"
KEY = (
    "status",
    "is_system_message",
    "receiving_endpoint",
    "receiving_host_id",
    "receiving_host",
    "message_type",
)
NULLABLE = ("receiving_host_id", "receiving_host", "message_type")
KEY_INDEX = "ux_failed_message_tallies_key"
_COLUMNS = ", ".join(KEY)
# The unique key and every ON CONFLICT target that names it (same text on both providers).
CONFLICT_TARGET = ", ".join(
    [c for c in KEY if c not in NULLABLE] + [f"coalesce({c}, ''), ({c} IS NULL)" for c in NULLABLE]
)
_TRIGGERS = ("insert", "update", "delete")


def _key_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("status", sa.SmallInteger(), nullable=False),
        sa.Column("is_system_message", sa.Boolean(), nullable=False),
        sa.Column("receiving_endpoint", sa.String(400), nullable=False),
        sa.Column("receiving_host_id", sa.String(100)),
        sa.Column("receiving_host", sa.String(400)),
        sa.Column("message_type", sa.Text()),
        sa.Column("messages", sa.BigInteger(), nullable=False),
    ]


def upgrade() -> None:
    dialect = migrating(revision)
    op.create_table(TALLIES, *_key_columns())
    op.execute(f"CREATE UNIQUE INDEX {KEY_INDEX} ON {TALLIES} ({CONFLICT_TARGET})")
    op.create_table(DELTAS, *_key_columns())
    if dialect == "postgresql":
        _create_postgresql_triggers()
    elif dialect == "sqlite":
        _create_sqlite_triggers()
    else:
        unsupported(dialect, revision)
    op.execute(
        f"INSERT INTO {TALLIES} ({_COLUMNS}, messages) "
        f"SELECT {_COLUMNS}, count(*) FROM failed_messages GROUP BY {_COLUMNS}"
    )


def downgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        for operation in (*_TRIGGERS, "truncate"):
            op.execute(f"DROP TRIGGER failed_messages_tally_{operation} ON failed_messages")
            op.execute(f"DROP FUNCTION failed_messages_tally_{operation}()")
    elif dialect == "sqlite":
        for operation in _TRIGGERS:
            op.execute(f"DROP TRIGGER failed_messages_tally_{operation}")
    else:
        unsupported(dialect, revision)
    op.drop_table(DELTAS)
    op.drop_table(TALLIES)


def _delta_insert(changes: str) -> str:
    """Append the net change per key of ``changes`` (rows of the key and ``n``, +1 or
    -1 each) to the deltas; keys whose changes cancel out are left out."""
    return (
        f"INSERT INTO {DELTAS} ({_COLUMNS}, messages) "
        f"SELECT {_COLUMNS}, sum(n) FROM ({changes}) AS changes "
        f"GROUP BY {_COLUMNS} HAVING sum(n) <> 0"
    )


def _create_postgresql_triggers() -> None:
    added = f"SELECT {_COLUMNS}, 1 AS n FROM new_rows"
    removed = f"SELECT {_COLUMNS}, -1 AS n FROM old_rows"
    bodies = {
        "insert": (_delta_insert(added), "NEW TABLE AS new_rows"),
        "update": (
            _delta_insert(f"{added} UNION ALL {removed}"),
            "OLD TABLE AS old_rows NEW TABLE AS new_rows",
        ),
        "delete": (_delta_insert(removed), "OLD TABLE AS old_rows"),
    }
    # Statement-level with transition tables: one INSERT per statement, however many
    # rows it changed (an upsert of 50 rows fires its INSERT and its UPDATE trigger once
    # each). A transition-table UPDATE trigger cannot name columns: every UPDATE fires
    # it, and one that changes no key column writes nothing.
    for operation, (body, referencing) in bodies.items():
        op.execute(
            f"CREATE FUNCTION failed_messages_tally_{operation}() RETURNS trigger "
            f"LANGUAGE plpgsql AS $$ BEGIN {body}; RETURN NULL; END $$"
        )
        op.execute(
            f"CREATE TRIGGER failed_messages_tally_{operation} AFTER {operation.upper()} "
            f"ON failed_messages REFERENCING {referencing} FOR EACH STATEMENT "
            f"EXECUTE FUNCTION failed_messages_tally_{operation}()"
        )
    # TRUNCATE waits for every writer of failed_messages to finish: what is left to count
    # is nothing.
    op.execute(
        "CREATE FUNCTION failed_messages_tally_truncate() RETURNS trigger "
        f"LANGUAGE plpgsql AS $$ BEGIN DELETE FROM {DELTAS}; DELETE FROM {TALLIES}; "
        "RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER failed_messages_tally_truncate AFTER TRUNCATE ON failed_messages "
        "FOR EACH STATEMENT EXECUTE FUNCTION failed_messages_tally_truncate()"
    )


def _sqlite_add(row: str, n: int) -> str:
    values = ", ".join(f"{row}.{c}" for c in KEY)
    return (
        f"INSERT INTO {TALLIES} ({_COLUMNS}, messages) VALUES ({values}, {n}) "
        f"ON CONFLICT ({CONFLICT_TARGET}) DO UPDATE SET messages = messages + {n};"
    )


def _sqlite_drop_empty(row: str) -> str:
    # The key's conditions in the unique index's own terms, so SQLite finds the row by it.
    conditions = [f"{c} = {row}.{c}" for c in KEY if c not in NULLABLE] + [
        f"coalesce({c}, '') = coalesce({row}.{c}, '') AND ({c} IS NULL) = ({row}.{c} IS NULL)"
        for c in NULLABLE
    ]
    return f"DELETE FROM {TALLIES} WHERE {' AND '.join(conditions)} AND messages = 0;"


def _create_sqlite_triggers() -> None:
    changed = " OR ".join(f"old.{c} IS NOT new.{c}" for c in KEY)
    op.execute(
        "CREATE TRIGGER failed_messages_tally_insert AFTER INSERT ON failed_messages "
        f"BEGIN {_sqlite_add('new', 1)} END"
    )
    op.execute(
        f"CREATE TRIGGER failed_messages_tally_update AFTER UPDATE OF {_COLUMNS} "
        f"ON failed_messages WHEN {changed} "
        f"BEGIN {_sqlite_add('new', 1)} {_sqlite_add('old', -1)} "
        f"{_sqlite_drop_empty('old')} END"
    )
    op.execute(
        "CREATE TRIGGER failed_messages_tally_delete AFTER DELETE ON failed_messages "
        f"BEGIN {_sqlite_add('old', -1)} {_sqlite_drop_empty('old')} END"
    )
