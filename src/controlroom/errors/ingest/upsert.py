"""The conditional upsert of failed messages: our guards, the provider's construct.

Source: docs/design.md "The conditional upsert". Every guard reads the pre-update row (in the
provider's upsert the table's columns are the stored values and ``incoming`` the row the
batch brings).

Attempts are counted exactly: the row keeps the distinct times of failure it has counted
(``counted_failure_times``, newest first, at most ``COUNTED_FAILURE_TIMES``), and a batch
adds only its times the row has not counted. A time is *known* to be uncounted when it is
not kept and either the row keeps every time it counted (the count equals the kept
times) or it is newer than the oldest kept one. A time older than every kept one of a row
that dropped some (past the bound, or stored before migration 0009) cannot be told from a
counted one: for those, and for a batch's own times past the bound, the seed's rule
applies — add them unless the batch's last attempt equals the stored one. Within the
bound, any split of the attempts into batches, in any order, with any batch replayed,
gives the true number of distinct attempts.

The update happens only when the batch adds at least one attempt (the ``WHERE`` of the
upsert), so a batch bringing nothing new writes nothing: no new row version, no index or
full-text work, ``last_modified`` unchanged, and a Resolved or Archived message is never
reopened by a redelivery. When it happens:

- status becomes Unresolved, and ``status_changed_at`` resets, when the stored status was
  not Unresolved (the batch brings an attempt not yet counted);
- the count adds the batch's uncounted attempts, and the kept times become the newest
  ``COUNTED_FAILURE_TIMES`` of the kept and the batch's;
- first failure = min, last failure = max; ``last_modified`` is the batch's time;
- every payload column takes the incoming value only when the incoming attempt is at
  least as new as the stored one.

A row the upsert skipped is not in its ``RETURNING`` rows (on both providers), so the
writer leaves that message's groups alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from controlroom.db.providers import Provider, Row
from controlroom.db.tables import FailedMessageStatus, failed_messages

COUNTED_FAILURE_TIMES = 32
"""Distinct times of failure a row keeps to recognise redeliveries (the most recent
ones). Past it the seed's rule counts the older attempts (see the module's docstring)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def failure_time_value(time_of_failure: datetime) -> int:
    """How ``counted_failure_times`` stores a time of failure: integer microseconds since
    the Unix epoch (UTC), exact on every provider."""
    delta = time_of_failure.astimezone(UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def counted_failure_times(failure_times: Sequence[datetime]) -> list[int]:
    """The ``counted_failure_times`` of a new row: the newest ``COUNTED_FAILURE_TIMES``
    of ``failure_times`` (distinct, newest first)."""
    return [failure_time_value(t) for t in failure_times[:COUNTED_FAILURE_TIMES]]


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
    "search_vector",  # the terms of the headers and body text above
)


def _outer(column: Any) -> ColumnElement[Any]:
    """``column`` of the upsert's stored or incoming row, for use inside a subquery of
    its ``SET`` or ``WHERE``. SQLAlchemy correlates subqueries only with an enclosing
    ``FROM``, which an ``INSERT`` has not; named as written, the reference reads the outer
    row (both names are fixed identifiers of our schema, never input)."""
    return sa.literal_column(f"{column.table.name}.{column.name}", type_=column.type)


def attempts_added(provider: Provider, incoming: Any) -> ColumnElement[int]:
    """How many attempts of the batch's row ``incoming`` the stored row has not counted
    (the rule in the module's docstring)."""
    stored = failed_messages.c
    kept = provider.list_elements(_outer(stored.counted_failure_times))
    oldest_kept = (
        sa.select(sa.func.min(kept.c.value))
        .select_from(kept)
        .correlate_except(kept)
        .scalar_subquery()
    )
    every_count_kept = _outer(stored.number_of_processing_attempts) == provider.list_length(
        _outer(stored.counted_failure_times)
    )
    # The seed's rule, for what cannot be told: a batch whose last attempt is the stored
    # one is a redelivery. (Over an empty kept list oldest_kept is NULL: nothing known.)
    seed_rule_counts = _outer(incoming.last_failure_at) != _outer(stored.last_failure_at)

    brought = provider.list_elements(_outer(incoming.counted_failure_times))
    already = provider.list_elements(_outer(stored.counted_failure_times))
    known_uncounted = sa.or_(every_count_kept, brought.c.value > oldest_kept)
    uncounted = (
        sa.select(sa.func.count())
        .select_from(brought)
        .where(
            brought.c.value.not_in(
                sa.select(already.c.value).select_from(already).correlate_except(already)
            ),
            sa.or_(known_uncounted, seed_rule_counts),
        )
        .scalar_subquery()
    )
    # The batch's own times past the bound were not sent: the seed's rule counts them.
    past_the_bound = sa.case(
        (
            sa.and_(
                incoming.last_failure_at != stored.last_failure_at,
                incoming.number_of_processing_attempts > COUNTED_FAILURE_TIMES,
            ),
            incoming.number_of_processing_attempts - COUNTED_FAILURE_TIMES,
        ),
        else_=0,
    )
    return uncounted + past_the_bound


def merged_failure_times(provider: Provider, incoming: Any) -> ColumnElement[Any]:
    """The newest ``COUNTED_FAILURE_TIMES`` distinct times of the stored and the batch's
    kept times, newest first."""
    kept = provider.list_elements(_outer(failed_messages.c.counted_failure_times))
    brought = provider.list_elements(_outer(incoming.counted_failure_times))
    both = sa.union(
        sa.select(kept.c.value).select_from(kept).correlate_except(kept),
        sa.select(brought.c.value).select_from(brought).correlate_except(brought),
    ).subquery()
    return provider.aggregate_list(
        sa.select(both.c.value).order_by(both.c.value.desc()).limit(COUNTED_FAILURE_TIMES)
    )


def conditional_upsert_guard(provider: Provider, incoming: Any) -> ColumnElement[bool]:
    """The ``WHERE`` of the conditional upsert: the batch brings an uncounted attempt."""
    return attempts_added(provider, incoming) > 0


def conditional_upsert_assignments(provider: Provider, incoming: Any) -> dict[str, Any]:
    """The ``SET`` clause of the conditional upsert; ``incoming`` is the batch's row. Only
    applied where ``conditional_upsert_guard`` holds (the batch adds an attempt)."""
    stored = failed_messages.c
    incoming_at_least_as_new = incoming.last_failure_at >= stored.last_failure_at
    reopens = stored.status != int(FailedMessageStatus.UNRESOLVED)

    assignments: dict[str, Any] = {
        "status": int(FailedMessageStatus.UNRESOLVED),
        "status_changed_at": sa.case(
            (reopens, incoming.status_changed_at), else_=stored.status_changed_at
        ),
        "number_of_processing_attempts": stored.number_of_processing_attempts
        + attempts_added(provider, incoming),
        "counted_failure_times": merged_failure_times(provider, incoming),
        "first_failure_at": sa.case(
            (incoming.first_failure_at < stored.first_failure_at, incoming.first_failure_at),
            else_=stored.first_failure_at,
        ),
        "last_failure_at": sa.case(
            (incoming.last_failure_at > stored.last_failure_at, incoming.last_failure_at),
            else_=stored.last_failure_at,
        ),
        "last_modified": incoming.last_modified,
    }
    for name in PAYLOAD_COLUMNS:
        assignments[name] = sa.case(
            (incoming_at_least_as_new, getattr(incoming, name)), else_=getattr(stored, name)
        )
    return assignments


ROW_COLUMNS: tuple[str, ...] = tuple(column.name for column in failed_messages.columns)
"""The columns of a row the upsert is given (``writer.failed_message_row``): all of them."""


@cache
def upsert_statement(provider: Provider) -> Any:
    """The conditional upsert of ``failed_messages`` on ``provider``, built once: its rows
    are bound at execution (``Provider.upsert_rows``; on PostgreSQL one text for any
    number of rows), so SQLAlchemy compiles it once and caches it. Returns ``(id,
    last_failure_at, inserted)`` of every row it inserted or updated, as it stands after
    the statement (a row the guard skipped is not returned); ``inserted`` as
    ``Provider.inserted_flag`` says (false for every row where the provider cannot tell)."""
    return provider.upsert_rows(
        failed_messages,
        columns=ROW_COLUMNS,
        key=[failed_messages.c.id],
        set_=lambda incoming: conditional_upsert_assignments(provider, incoming),
        where=lambda incoming: conditional_upsert_guard(provider, incoming),
        returning=[
            failed_messages.c.id,
            failed_messages.c.last_failure_at,
            provider.inserted_flag(failed_messages).label("inserted"),
        ],
    )


def upsert_failed_messages(
    conn: sa.Connection, provider: Provider, rows: Sequence[Row]
) -> list[sa.Row[*tuple[Any, ...]]]:
    """Conditionally upsert ``rows`` (dicts of ``ROW_COLUMNS``, sorted by id), one
    statement per chunk of at most ``provider.max_rows_per_statement`` rows
    (``Provider.write_rows``).

    Returns ``(id, last_failure_at, inserted)`` of every row inserted or updated, as it
    stands after its statement, so the caller knows whose stored attempt is now the
    batch's, and which rows are new (``inserted``, where the provider tells:
    ``Provider.inserted_flag``), without a read before the write; rows the guard skipped
    (nothing new) are left out.
    """
    return provider.write_rows(conn, upsert_statement(provider), rows)
