"""The conditional upsert's guards, shared by providers with ``INSERT ... ON CONFLICT``.

Source: DESIGN.md "The conditional upsert". Every guard reads the pre-update row (in
``ON CONFLICT DO UPDATE`` the target table's columns are the stored values and
``excluded`` the incoming ones):

- status becomes Unresolved, and ``status_changed_at`` resets, when the stored status was
  not Unresolved and the batch brings an attempt other than the stored one;
- the attempt count adds the batch's count unless the batch's last attempt equals the
  stored one (a redelivery, e.g. a batch replayed after an ambiguous commit);
- first failure = min, last failure = max;
- every payload column takes the incoming value only when the incoming attempt is at
  least as new as the stored one.

A redelivery of the stored attempt therefore changes nothing, ``last_modified`` included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from controlroom.db.tables import FailedMessageStatus, failed_messages

MAX_ROWS_PER_STATEMENT = 50
"""Rows per upsert statement (DESIGN.md: one set-based statement per chunk of at most 50)."""

# Columns taken from the newest attempt, all together.
PAYLOAD_COLUMNS: tuple[str, ...] = (
    "message_id",
    "message_type",
    "time_sent",
    "is_system_message",
    "conversation_id",
    "exception_type",
    "exception_message",
    "exception_source",
    "stack_trace",
    "queue_address",
    "receiving_endpoint",
    "receiving_host_id",
    "receiving_host",
    "sending_endpoint",
    "sending_host_id",
    "sending_host",
    "headers_json",
    "content_type",
    "body_size",
    "body_text",
    "body_stored_externally",
    "body_key",
)

Row = Mapping[str, Any]


def chunked(rows: Sequence[Row], size: int) -> Iterator[Sequence[Row]]:
    """Consecutive slices of ``rows`` of at most ``size`` rows, order kept."""
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def conditional_upsert_assignments(incoming: Any) -> dict[str, ColumnElement[Any]]:
    """The ``SET`` clause of the conditional upsert; ``incoming`` is ``insert.excluded``."""
    stored = failed_messages.c
    new_attempt = incoming.last_failure_at != stored.last_failure_at
    incoming_is_newest = incoming.last_failure_at >= stored.last_failure_at
    reopens = sa.and_(stored.status != int(FailedMessageStatus.UNRESOLVED), new_attempt)

    assignments: dict[str, ColumnElement[Any]] = {
        "status": sa.case((reopens, int(FailedMessageStatus.UNRESOLVED)), else_=stored.status),
        "status_changed_at": sa.case(
            (reopens, incoming.status_changed_at), else_=stored.status_changed_at
        ),
        "number_of_processing_attempts": stored.number_of_processing_attempts
        + sa.case((new_attempt, incoming.number_of_processing_attempts), else_=0),
        "first_failure_at": sa.case(
            (incoming.first_failure_at < stored.first_failure_at, incoming.first_failure_at),
            else_=stored.first_failure_at,
        ),
        "last_failure_at": sa.case(
            (incoming.last_failure_at > stored.last_failure_at, incoming.last_failure_at),
            else_=stored.last_failure_at,
        ),
        "last_modified": sa.case((new_attempt, incoming.last_modified), else_=stored.last_modified),
    }
    for name in PAYLOAD_COLUMNS:
        assignments[name] = sa.case(
            (incoming_is_newest, getattr(incoming, name)), else_=getattr(stored, name)
        )
    return assignments


@dataclass(frozen=True)
class ErrorWriteDialect:
    """Write-path SQL for a provider whose ``insert()`` has ``on_conflict_do_*``.

    ``insert`` is the provider's own construct (``sqlalchemy.dialects.<name>.insert``).
    """

    name: str
    insert: Callable[[sa.Table], Any]
    max_rows_per_statement: int = MAX_ROWS_PER_STATEMENT

    @cached_property
    def upsert_statement(self) -> Any:
        """The conditional upsert of ``failed_messages``, built once: with one shape for
        every chunk, SQLAlchemy compiles it once and caches it."""
        statement = self.insert(failed_messages)
        return statement.on_conflict_do_update(
            index_elements=[failed_messages.c.id],
            set_=conditional_upsert_assignments(statement.excluded),
        ).returning(failed_messages.c.id, failed_messages.c.last_failure_at)

    def upsert_failed_messages(self, conn: sa.Connection, rows: Sequence[Row]) -> list[sa.Row[Any]]:
        """Conditionally upsert ``rows`` (sorted by id), one statement per chunk.

        SQLAlchemy's "insertmanyvalues" renders the parameter list as multi-row
        ``INSERT ... VALUES (...), (...) ON CONFLICT ...`` statements of at most
        ``max_rows_per_statement`` rows each. Returns ``(id, last_failure_at)`` of every
        row as it stands after its statement, so the caller knows whose stored attempt is
        now the batch's, without a read before the write.
        """
        if not rows:
            return []
        return conn.execute(
            self.upsert_statement,
            list(rows),
            execution_options={"insertmanyvalues_page_size": self.max_rows_per_statement},
        ).all()

    def insert_if_absent(self, conn: sa.Connection, table: sa.Table, rows: Sequence[Row]) -> None:
        """Insert ``rows`` into ``table``, leaving rows whose primary key exists untouched."""
        if not rows:
            return
        key = list(table.primary_key.columns)
        conn.execute(
            self.insert(table).on_conflict_do_nothing(index_elements=key),
            list(rows),
            execution_options={"insertmanyvalues_page_size": self.max_rows_per_statement},
        )
