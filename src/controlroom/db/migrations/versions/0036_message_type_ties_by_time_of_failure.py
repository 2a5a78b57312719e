"""the indexes by message type order equal types by the time of failure

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-06 06:00:00.000000

Source: docs/decisions.md "A subset is read from its own rows" (the walks by message
type: migrations 0025, 0029, 0032); the cost in ``benchmarks/README.md`` "Where the
full-page images go, and lz4 for them".

Every list's sort by message type now orders equal types by the stored attempt's time of
failure, then the id (``errors.read.filters``): ServiceControl leaves the order of equal
types unspecified, and ordered by the id, a random UUID, each new failure's entry in an
index by message type landed at a random place within its type's range. After each
checkpoint the first change of an index page is logged whole: into 1,000,000 stored
messages a drain wrote 1.4-1.9 full-page images per message for the group rows' index by
message type alone, where the indexes by time of failure, whose new entries come at the
end of each range, took under 0.1. Rebuilt with ``last_failure_at`` before the id, each
index walks in the lists' new order and takes new failures at the end of their type:

- ``(status, message_type, last_failure_at, id)`` (0025's ``(status, message_type, id)``),
- ``(receiving_endpoint, message_type, last_failure_at, id)`` and ``(lower(queue_address),
  message_type, last_failure_at, id)``, partial to the types of at most 1,000 bytes as
  0032 made them (the endpoint's ``INCLUDE (status)`` on PostgreSQL): 8 more bytes
  beside the longest endpoint name and type still fit PostgreSQL's 2,704;
- ``(group_id, message_type, last_failure_at, failed_message_id)`` on the group rows,
  from their copy of the message's time of failure (0011), equal to the message's in
  every committed state (0029's ``(group_id, message_type, failed_message_id)``).

The names stay. A new attempt changes ``last_failure_at``: on PostgreSQL it changes
indexed columns (status, last_modified) already, never a HOT update; on SQLite it now
rewrites these entries too. ``NULLS FIRST`` on PostgreSQL for the message type, as the
lists order an empty type.
"""

from __future__ import annotations

from alembic import op

from controlroom.db.migrations._dialects import Dialect, migrating, unsupported

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None

MESSAGES = "failed_messages"
GROUPS = "failed_message_groups"
TYPE_BYTES = 1000  # errors.read.lists.INDEXED_TYPE_BYTES, as 0032
# (index, table, the columns before the message type, the id's column, PostgreSQL's
# INCLUDE, partial to the types of at most TYPE_BYTES)
INDEXES = (
    (f"ix_{MESSAGES}_status_message_type_id", MESSAGES, "status", "id", None, False),
    (
        f"ix_{MESSAGES}_receiving_endpoint_message_type",
        MESSAGES,
        "receiving_endpoint",
        "id",
        "status",
        True,
    ),
    (
        f"ix_{MESSAGES}_queue_address_lower_message_type",
        MESSAGES,
        "lower(queue_address)",
        "id",
        None,
        True,
    ),
    (f"ix_{GROUPS}_group_id_message_type", GROUPS, "group_id", "failed_message_id", None, False),
)


def upgrade() -> None:
    _rebuild(by_time_of_failure=True)


def downgrade() -> None:
    _rebuild(by_time_of_failure=False)


def _rebuild(*, by_time_of_failure: bool) -> None:
    dialect = migrating(revision)
    ties = "last_failure_at, " if by_time_of_failure else ""
    for name, table, leading, id_column, included, partial in INDEXES:
        include = f" INCLUDE ({included})" if included and dialect == "postgresql" else ""
        where = f" WHERE coalesce({_octet_length(dialect)}, 0) <= {TYPE_BYTES}" if partial else ""
        op.execute(f"DROP INDEX {name}")
        op.execute(
            f"CREATE INDEX {name} ON {table} "
            f"({leading}, {_message_type(dialect)}, {ties}{id_column}){include}{where}"
        )
    if dialect == "postgresql":
        op.execute(f"ANALYZE {MESSAGES}")
        op.execute(f"ANALYZE {GROUPS}")


def _octet_length(dialect: Dialect) -> str:
    """The message type's length in bytes of UTF-8, as ``Provider.octet_length`` writes it
    (0032: a planner uses a partial index only for a condition that is the index's own)."""
    if dialect == "postgresql":
        return "octet_length(message_type)"
    if dialect == "sqlite":
        return "length(CAST(message_type AS BLOB))"
    unsupported(dialect, revision)


def _message_type(dialect: Dialect) -> str:
    """The index element of the message type: empty values first ascending."""
    if dialect == "postgresql":
        return "message_type NULLS FIRST"
    if dialect == "sqlite":
        return "message_type"  # SQLite sorts NULLs first in ascending order already
    unsupported(dialect, revision)
