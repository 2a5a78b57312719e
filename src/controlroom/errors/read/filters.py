"""What a read of failed messages selects and orders by: the filter, the sort keys and
the page window, as conditions and clauses over ``failed_messages``.

Lists are filtered by a ``FailedMessageFilter`` and ordered by an ``Ordering``: one of
ServiceControl's sort keys, then the id in the same direction, so equal keys never make
pages overlap or skip rows; equal message types are ordered by the stored attempt's time
of failure before the id (``_TIES_BROKEN_BY``). An empty value (no ``message_type``, no
``time_sent``) sorts as the smallest: first ascending, last descending, on every provider.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal, get_args

import sqlalchemy as sa

from controlroom.db.providers import Provider
from controlroom.db.tables import (
    TYPE_TIES,
    FailedMessageStatus,
    failed_message_groups,
    failed_messages,
)

fm = failed_messages.c


Operand = Callable[[sa.ColumnElement[Any]], sa.ColumnElement[Any]]


def failed_in_queue(
    queue_address: str, operand: Operand = lambda column: column
) -> sa.ColumnElement[bool]:
    """The messages that failed in ``queue_address``, matched in any case as
    ServiceControl's queue-address filter and retry match: a queue's retry and the
    pending retries of a queue take the messages its list shows. Both sides are folded
    by the database, so they fold alike (SQLite folds ASCII letters only); the
    ``lower(queue_address)`` indexes serve it (docs/decisions.md "A subset is read from
    its own rows")."""
    return sa.func.lower(operand(fm.queue_address)) == sa.func.lower(sa.literal(queue_address))


SortKey = Literal[
    "id",
    "message_id",
    "message_type",
    "status",
    "time_sent",
    "modified",
    "time_of_failure",
    "time_of_retry_request",
]
SORT_KEYS: tuple[SortKey, ...] = get_args(SortKey)
DEFAULT_SORT: SortKey = "time_sent"

# ServiceControl's sort keys and the column each one orders by.
_SORT_COLUMNS: dict[SortKey, sa.Column[Any]] = {
    "id": fm.id,
    "message_id": fm.message_id,
    "message_type": fm.message_type,
    "status": fm.status,
    "time_sent": fm.time_sent,
    "modified": fm.last_modified,
    "time_of_failure": fm.last_failure_at,
    # ServicePulse's Pending Retries view: a retry request sets the status, which stamps
    # last_modified, so a RetryIssued message's last_modified is when its retry was asked.
    "time_of_retry_request": fm.last_modified,
}

# The columns that order a key's equal values before the id, in the key's direction.
# ServiceControl leaves the order of equal message types unspecified; by the stored
# attempt's time of failure (``TYPE_TIES``), an operator reads a type's messages as they
# failed, and the indexes by message type take each new failure at the end of its type's
# range, not at a random place by its random id (migration 0036).
_TIES_BROKEN_BY: dict[SortKey, tuple[sa.Column[Any], ...]] = {
    "message_type": (fm[TYPE_TIES],),
}


@dataclass(frozen=True, slots=True)
class Ordering:
    """Sort by ``key`` (ServiceControl's name), newest/largest first when ``descending``."""

    key: SortKey = DEFAULT_SORT
    descending: bool = True


@dataclass(frozen=True, slots=True)
class FailedMessageFilter:
    """Which failed messages a list holds; every part is optional and all parts must hold.

    ``statuses``: only these (empty: any); ``excluded_statuses``: none of these;
    ``modified_from`` / ``modified_to``: ``last_modified`` within, both bounds inclusive;
    ``failed_from`` / ``failed_to``: the stored attempt's time of failure
    (``last_failure_at``) within, both bounds inclusive; ``queue_address``:
    case-insensitive match (ServiceControl's); ``receiving_endpoint``: exact match;
    ``group_id``: member of that failure group; ``conversation_id``: exact match;
    ``include_system_messages`` false: no system messages.
    """

    statuses: frozenset[FailedMessageStatus] = frozenset()
    excluded_statuses: frozenset[FailedMessageStatus] = frozenset()
    modified_from: datetime | None = None
    modified_to: datetime | None = None
    failed_from: datetime | None = None
    failed_to: datetime | None = None
    queue_address: str | None = None
    receiving_endpoint: str | None = None
    group_id: str | None = None
    conversation_id: str | None = None
    include_system_messages: bool = True


EVERY_MESSAGE = FailedMessageFilter()


def filter_conditions(
    where: FailedMessageFilter, equality_operand: Operand = lambda column: column
) -> list[sa.ColumnElement[bool]]:
    """The WHERE conditions of ``where`` over ``failed_messages`` (to be ANDed); the
    columns of its equality conditions (status, queue address, receiving endpoint) as
    ``equality_operand`` gives them."""
    conditions = status_conditions(equality_operand(fm.status), where)
    if where.modified_from is not None:
        conditions.append(fm.last_modified >= where.modified_from)
    if where.modified_to is not None:
        conditions.append(fm.last_modified <= where.modified_to)
    if where.failed_from is not None:
        conditions.append(fm.last_failure_at >= where.failed_from)
    if where.failed_to is not None:
        conditions.append(fm.last_failure_at <= where.failed_to)
    if where.queue_address is not None:
        conditions.append(failed_in_queue(where.queue_address, equality_operand))
    if where.receiving_endpoint is not None:
        conditions.append(equality_operand(fm.receiving_endpoint) == where.receiving_endpoint)
    if where.conversation_id is not None:
        conditions.append(fm.conversation_id == where.conversation_id)
    if not where.include_system_messages:
        conditions.append(fm.is_system_message.is_(False))
    if where.group_id is not None:
        groups = failed_message_groups.c
        conditions.append(
            sa.exists().where(groups.failed_message_id == fm.id, groups.group_id == where.group_id)
        )
    return conditions


def subset_conditions(
    where: FailedMessageFilter, provider: Provider
) -> list[sa.ColumnElement[bool]]:
    """The WHERE conditions of ``where``, which names an endpoint or a queue address (or
    both), for reading that subset's rows by its own index: the subset's conditions as
    they are, its statuses kept from every index on every provider
    (``Provider.never_indexed``), its other equality conditions from every index on a
    planner without statistics (``Provider.without_index``).

    A status is never the subset read: it holds messages of every endpoint and queue,
    and every new failure anywhere joins the Unresolved, so walking a status's index
    passes every newer message of that status outside the subset. Walking the subset's
    index passes only the subset's own messages in other statuses, which retention
    bounds (Resolved and Archived messages go after the retention period)."""
    subset = FailedMessageFilter(
        receiving_endpoint=where.receiving_endpoint, queue_address=where.queue_address
    )
    others = replace(
        where,
        receiving_endpoint=None,
        queue_address=None,
        statuses=frozenset(),
        excluded_statuses=frozenset(),
    )
    return (
        filter_conditions(subset)
        + [provider.never_indexed(c) for c in status_conditions(fm.status, where)]
        + filter_conditions(others, provider.without_index)
    )


def order_by(
    provider: Provider, order: Ordering, columns: sa.ColumnCollection[str, Any] | None = None
) -> list[sa.ColumnElement[Any]]:
    """ORDER BY clauses for ``order`` on ``provider``: the key, then the id in the same
    direction (``sort_columns``).

    ``columns`` are those of a subquery or CTE that selected ``sort_columns(order)``;
    by default ``failed_messages``' own. Empty values sort as the smallest on every
    provider (``Provider.order_nulls_smallest``: PostgreSQL would put them last
    ascending); the PostgreSQL indexes of the sort keys are built in this order
    (migration 0004).
    """
    source = columns if columns is not None else failed_messages.c
    ordered: list[sa.ColumnElement[Any]] = []
    for column in sort_columns(order):
        clause = source[column.name]
        if column.nullable:
            ordered.append(provider.order_nulls_smallest(clause, descending=order.descending))
        else:
            ordered.append(clause.desc() if order.descending else clause.asc())
    return ordered


def sort_columns(order: Ordering) -> list[sa.Column[Any]]:
    """The ``failed_messages`` columns ``order`` sorts by: the key's, those breaking its
    ties (by message type: the stored attempt's time of failure), then the id."""
    column = _SORT_COLUMNS[order.key]
    if column is fm.id:
        return [column]
    return [column, *_TIES_BROKEN_BY.get(order.key, ()), fm.id]


def status_conditions(
    column: sa.ColumnElement[Any], where: FailedMessageFilter
) -> list[sa.ColumnElement[bool]]:
    """The conditions on ``column`` (a status column: the messages', or a copy of it) of
    ``where``'s statuses and excluded statuses (to be ANDed; none when it names none)."""
    conditions: list[sa.ColumnElement[bool]] = []
    if where.statuses:
        conditions.append(column.in_(sorted(int(s) for s in where.statuses)))
    if where.excluded_statuses:
        conditions.append(column.not_in(sorted(int(s) for s in where.excluded_statuses)))
    return conditions


def status_and_group_only(where: FailedMessageFilter) -> bool:
    """True when ``where`` filters by nothing but statuses and a group."""
    others = replace(where, statuses=frozenset(), excluded_statuses=frozenset(), group_id=None)
    return others == EVERY_MESSAGE


def message_id_is(message_id: str) -> sa.ColumnElement[bool]:
    """The failed messages whose ``NServiceBus.MessageId`` is ``message_id``, a condition
    naming every status as well: the message id is indexed after the status only,
    ``(status, message_id, id)`` (migration 0027), so a lookup seeks each status's range
    of that index."""
    # One bound value per status, not an expanding list: the statement's text is whole
    # when compiled (its plan can be explained as it is sent).
    every_status = [sa.literal(int(status), fm.status.type) for status in FailedMessageStatus]
    return sa.and_(fm.status.in_(every_status), fm.message_id == message_id)


def check_window(offset: int, limit: int) -> None:
    """Raises ``ValueError`` for a negative ``offset`` or a ``limit`` below 1."""
    if offset < 0 or limit < 1:
        raise ValueError(f"offset must be >= 0 and limit >= 1, got {offset} and {limit}")


def as_uuid(text: str) -> str | None:
    """``text`` as a lower-case "D" UUID (the form of a UniqueMessageId), ``None`` when it
    is not a UUID."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None
