"""an endpoint's and a queue address's page by message type walks their own rows

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-05 11:00:00.000000

Source: docs/decisions.md "A subset is read from its own rows" (figures in
``benchmarks/README.md`` "``stopped.py``").

An endpoint's or a queue address's page by message type read the subset's rows and
sorted them: 209-216 ms for a 72,537-message subset at 1,250,000 rows. Indexed after the
subset's column, as its time sorts are (migration 0020), it walks the subset's rows in
order and reads a page:

- ``(receiving_endpoint, message_type, id)`` and ``(lower(queue_address), message_type,
  id)``, for the messages whose type is at most 1,000 bytes of UTF-8 (partial). A message
  type is as long as its producer makes it; beside an endpoint name or an address of 400
  four-byte characters (their columns' limit, 1,600 bytes) a type of 1,000 bytes keeps an
  entry within PostgreSQL's 2,704 bytes, where an index of every type would refuse the
  message. The endpoint's includes ``status`` on PostgreSQL (a page of a status reads the
  index alone once vacuumed).
- ``(receiving_endpoint)`` and ``(lower(queue_address))`` for the messages of a longer
  type (partial, empty but for forged headers): a page merges the walk of the first with
  a sort of the subset's long types, ``errors.read.lists``.

The predicate is written as the providers write it in a query
(``Provider.octet_length``): a planner uses a partial index only for a condition that is
the index's own. A message's type never changes with its status or times, so no update
that was HOT stops being one.
"""

from __future__ import annotations

from alembic import op

from controlroom.db.migrations._dialects import Dialect, migrating, unsupported

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

MESSAGES = "failed_messages"
TYPE_BYTES = 1000  # errors.read.lists.INDEXED_TYPE_BYTES
# (index, the subset's key, PostgreSQL's INCLUDE)
SHORT = (
    ("ix_failed_messages_receiving_endpoint_message_type", "receiving_endpoint", "status"),
    ("ix_failed_messages_queue_address_lower_message_type", "lower(queue_address)", None),
)
LONG = (
    ("ix_failed_messages_receiving_endpoint_long_type", "receiving_endpoint"),
    ("ix_failed_messages_queue_address_lower_long_type", "lower(queue_address)"),
)


def upgrade() -> None:
    dialect = migrating(revision)
    octets = f"coalesce({_octet_length(dialect)}, 0)"
    for name, subset, included in SHORT:
        include = f" INCLUDE ({included})" if included and dialect == "postgresql" else ""
        op.execute(
            f"CREATE INDEX {name} ON {MESSAGES} ({subset}, {_message_type(dialect)}, id)"
            f"{include} WHERE {octets} <= {TYPE_BYTES}"
        )
    for name, subset in LONG:
        op.execute(f"CREATE INDEX {name} ON {MESSAGES} ({subset}) WHERE {octets} > {TYPE_BYTES}")
    if dialect == "postgresql":
        op.execute(f"ANALYZE {MESSAGES}")


def downgrade() -> None:
    migrating(revision)
    for name, *_ in (*SHORT, *LONG):
        op.execute(f"DROP INDEX {name}")


def _octet_length(dialect: Dialect) -> str:
    """The message type's length in bytes of UTF-8, as ``Provider.octet_length`` writes it."""
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
