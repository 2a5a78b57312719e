"""The conditional upsert of failed messages: our guards, the provider's construct.

Source: DESIGN.md "The conditional upsert". Every guard reads the pre-update row (in the
provider's upsert the table's columns are the stored values and ``incoming`` the row the
batch brings):

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

from collections.abc import Sequence
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from controlroom.db.providers import Provider, Row
from controlroom.db.tables import FailedMessageStatus, failed_messages

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


def conditional_upsert_assignments(incoming: Any) -> dict[str, ColumnElement[Any]]:
    """The ``SET`` clause of the conditional upsert; ``incoming`` is the batch's row."""
    stored = failed_messages.c
    not_a_redelivery = incoming.last_failure_at != stored.last_failure_at
    incoming_at_least_as_new = incoming.last_failure_at >= stored.last_failure_at
    reopens = sa.and_(stored.status != int(FailedMessageStatus.UNRESOLVED), not_a_redelivery)

    assignments: dict[str, ColumnElement[Any]] = {
        "status": sa.case((reopens, int(FailedMessageStatus.UNRESOLVED)), else_=stored.status),
        "status_changed_at": sa.case(
            (reopens, incoming.status_changed_at), else_=stored.status_changed_at
        ),
        "number_of_processing_attempts": stored.number_of_processing_attempts
        + sa.case((not_a_redelivery, incoming.number_of_processing_attempts), else_=0),
        "first_failure_at": sa.case(
            (incoming.first_failure_at < stored.first_failure_at, incoming.first_failure_at),
            else_=stored.first_failure_at,
        ),
        "last_failure_at": sa.case(
            (incoming.last_failure_at > stored.last_failure_at, incoming.last_failure_at),
            else_=stored.last_failure_at,
        ),
        "last_modified": sa.case(
            (not_a_redelivery, incoming.last_modified), else_=stored.last_modified
        ),
    }
    for name in PAYLOAD_COLUMNS:
        assignments[name] = sa.case(
            (incoming_at_least_as_new, getattr(incoming, name)), else_=getattr(stored, name)
        )
    return assignments


@cache
def upsert_statement(provider: Provider) -> Any:
    """The conditional upsert of ``failed_messages`` on ``provider``, built once: with one
    shape for every chunk, SQLAlchemy compiles it once and caches it. Returns
    ``(id, last_failure_at)`` of every row as it stands after the statement."""
    statement = provider.upsert(
        failed_messages, key=[failed_messages.c.id], set_=conditional_upsert_assignments
    )
    return statement.returning(failed_messages.c.id, failed_messages.c.last_failure_at)


def upsert_failed_messages(
    conn: sa.Connection, provider: Provider, rows: Sequence[Row]
) -> list[sa.Row[Any]]:
    """Conditionally upsert ``rows`` (sorted by id), one statement per chunk.

    SQLAlchemy's "insertmanyvalues" sends the parameter list as multi-row statements of
    at most ``provider.max_rows_per_statement`` rows each. Returns ``(id,
    last_failure_at)`` of every row as it stands after its statement, so the caller knows
    whose stored attempt is now the batch's, without a read before the write.
    """
    if not rows:
        return []
    return conn.execute(
        upsert_statement(provider), list(rows), execution_options=provider.executemany_options()
    ).all()
