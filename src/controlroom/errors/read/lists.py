"""Pages of failed messages as the API and console list them: by filter and sort key,
a group's members, the queue addresses and the pending retries of a queue.

SQLAlchemy Core only, every value a bound parameter. Every function takes an open
``Connection`` so a caller can read a page and its total in one transaction. Times are
timezone-aware UTC.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.db.tables import (
    GROUP_COPIES,
    FailedMessageStatus,
    failed_message_groups,
    failed_messages,
)
from controlroom.errors.read.counts import count_matching
from controlroom.errors.read.filters import (
    EVERY_MESSAGE,
    FailedMessageFilter,
    Ordering,
    check_window,
    filter_conditions,
    order_by,
    sort_columns,
    status_and_group_only,
    status_conditions,
)
from controlroom.errors.read.summaries import (
    SUMMARY_COLUMNS,
    FailedMessagePage,
    SearchPage,
    hits_page,
    to_summary,
)

fm = failed_messages.c


GROUP_IDS_FIRST = 7_000
"""A group's page is read from the group's ids when at most this many of its messages
match, else by walking the sort key's index. The walk tests about (offset + limit) x
(all messages / matching messages) rows, the ids cost one lookup each plus a sort:
they cross near the square root of 50 x all messages (7,000 at 1,000,000)."""

WALK_SORT_INDEX_PAST = GROUP_IDS_FIRST
"""Past this many matching messages a list page is read by walking the sort key's index
and filtering what it yields: the filter's equality conditions (status, endpoint, queue)
are kept from every index (``Provider.without_index``), where a planner without
statistics (SQLite) reads every match from the condition's index and sorts them all
(700,000 Unresolved of 1,000,000). The same crossing as ``GROUP_IDS_FIRST``."""


@dataclass(frozen=True, slots=True)
class QueueAddressCount:
    """A queue failed messages came from, and how many failed messages name it."""

    address: str
    failed_message_count: int


@dataclass(frozen=True, slots=True)
class QueueAddressPage:
    """One page of queue addresses (by address) and the number of addresses in all."""

    total: int
    items: list[QueueAddressCount] = field(default_factory=list)


def list_failed_messages(
    conn: sa.Connection,
    *,
    offset: int,
    limit: int,
    where: FailedMessageFilter = EVERY_MESSAGE,
    order: Ordering = Ordering(),
    exact_count_limit: int | None = None,
) -> FailedMessagePage:
    """Failed messages matching ``where`` in ``order``, ``limit`` rows from ``offset``,
    with the number of matching rows (``count_matching``: exact, or an estimate past
    ``exact_count_limit``).

    Raises ``ValueError`` for a negative ``offset`` or a ``limit`` below 1.
    """
    check_window(offset, limit)
    total = count_matching(conn, where, exact_count_limit)
    page = _page_ids(conn, where, order, offset=offset, limit=limit, total=total.value)
    rows = conn.execute(
        sa.select(*SUMMARY_COLUMNS)
        .join_from(failed_messages, page, fm.id == page.c.id)
        .order_by(*order_by(provider_for(conn), order))
    ).all()
    total = total.at_least_seen(offset, len(rows), limit)
    return FailedMessagePage(
        total=total.value,
        items=[to_summary(row) for row in rows],
        total_estimated=total.estimated,
    )


def _page_ids(
    conn: sa.Connection,
    where: FailedMessageFilter,
    order: Ordering,
    *,
    offset: int,
    limit: int,
    total: int,
) -> sa.Subquery:
    """The ids of one page, as a subquery to join the page's rows to; ``total`` is how
    many messages match ``where``.

    The page's ids are found first and only those rows read: walking past ``offset`` rows
    then reads index entries alone (the sort keys' indexes end with the id), not rows. A
    group of at most ``GROUP_IDS_FIRST`` matching messages is read from its ids, so no
    provider walks a sort key's index through a million messages for a few hundred (the
    form SQLite chooses for a membership test, having no statistics); more than
    ``WALK_SORT_INDEX_PAST`` matches are found by that walk, whatever their filter.
    """
    provider = provider_for(conn)
    if where.group_id is not None and total <= GROUP_IDS_FIRST:
        # Fenced in a materialized CTE: given the same condition as a membership test,
        # the planner may still walk the sort key's index probing each message (0.7 s
        # for a group of 5,946 among 1,000,000, benchmarks/query.py).
        members = provider.materialized_cte(
            _members_from_group_rows(where, order)
            if _group_rows_hold(where, order)
            else _members_joined(where, order),
            "members",
        )
        return (
            sa.select(members.c.id)
            .order_by(*order_by(provider, order, members.c))
            .limit(limit)
            .offset(offset)
            .subquery("page")
        )
    if total > WALK_SORT_INDEX_PAST:
        conditions = filter_conditions(where, provider.without_index)
    else:
        conditions = filter_conditions(where)
    return (
        sa.select(fm.id)
        .where(*conditions)
        .order_by(*order_by(provider, order))
        .limit(limit)
        .offset(offset)
        .subquery("page")
    )


def _group_rows_hold(where: FailedMessageFilter, order: Ordering) -> bool:
    """True when the group rows alone answer a page of ``where`` in ``order``: it filters
    by a group and statuses only, and sorts by columns the group rows hold a copy of
    (``GROUP_COPIES``: time of failure, status)."""
    keys = [column.name for column in sort_columns(order) if column is not fm.id]
    return status_and_group_only(where) and all(key in GROUP_COPIES for key in keys)


def _members_from_group_rows(where: FailedMessageFilter, order: Ordering) -> sa.Select[Any]:
    """The ids and sort keys of a group's messages matching ``where``, read from its
    group rows and their copies of the sort key, equal to the message's in every
    committed state (migrations 0011, 0013): one group-row read per member, where joining
    the messages cost a primary-key probe and a message row each (the medium group's
    page of ServicePulse's default sort, ``benchmarks/query.py``)."""
    groups = failed_message_groups.c
    copies = [
        groups.failed_message_id.label("id") if column is fm.id else groups[column.name]
        for column in sort_columns(order)
    ]
    return sa.select(*copies).where(
        groups.group_id == where.group_id, *status_conditions(groups.status, where)
    )


def _members_joined(where: FailedMessageFilter, order: Ordering) -> sa.Select[Any]:
    """The ids and sort keys of a group's messages matching ``where``: its group rows
    joined to the messages."""
    groups = failed_message_groups.c
    return (
        sa.select(*sort_columns(order))
        .join_from(failed_message_groups, failed_messages, groups.failed_message_id == fm.id)
        .where(groups.group_id == where.group_id, *filter_conditions(replace(where, group_id=None)))
    )


def list_message_hits(
    conn: sa.Connection,
    *,
    offset: int,
    limit: int,
    where: FailedMessageFilter = EVERY_MESSAGE,
    order: Ordering = Ordering(),
    exact_count_limit: int | None = None,
) -> SearchPage:
    """``list_failed_messages`` with what ServiceControl's message views show besides
    (conversation, headers, body size): the rows of ``/api/messages`` and its kin.

    Raises ``ValueError`` for a negative ``offset`` or a ``limit`` below 1.
    """
    check_window(offset, limit)
    total = count_matching(conn, where, exact_count_limit)
    page = _page_ids(conn, where, order, offset=offset, limit=limit, total=total.value)
    return hits_page(conn, page, order, total, offset=offset, limit=limit)


def list_queue_addresses(conn: sa.Connection, *, offset: int, limit: int) -> QueueAddressPage:
    """The distinct queue addresses (``NServiceBus.FailedQ``) of failed messages, each with
    its count of failed messages in any status, by address; ``limit`` from ``offset``.

    Source: ServiceControl ``QueueAddressIndex`` (a count over every failed message).
    Raises ``ValueError`` for a negative ``offset`` or a ``limit`` below 1.
    """
    check_window(offset, limit)
    # One pass over the queue-address index: the number of addresses rides along on every
    # row of the page (a window over the grouped rows, before LIMIT).
    rows = conn.execute(
        sa.select(fm.queue_address, sa.func.count(), sa.func.count().over())
        .group_by(fm.queue_address)
        .order_by(fm.queue_address)
        .limit(limit)
        .offset(offset)
    ).all()
    if rows:
        total = int(rows[0][2])
    else:  # past the last page, or nothing at all: count on its own
        addresses = sa.select(fm.queue_address).group_by(fm.queue_address).subquery()
        total = int(conn.execute(sa.select(sa.func.count()).select_from(addresses)).scalar_one())
    return QueueAddressPage(
        total=total,
        items=[QueueAddressCount(address=row[0], failed_message_count=int(row[1])) for row in rows],
    )


def pending_retry_ids(
    conn: sa.Connection, queue_address: str, start: datetime, end: datetime
) -> list[str]:
    """Ids of the pending retries (RetryIssued) that failed in ``queue_address`` and whose
    ``last_modified`` (when the retry was asked) is within ``start`` .. ``end`` (both
    inclusive, UTC), sorted. Source: ServiceControl ``RetryPendingMessages``."""
    return list(
        conn.scalars(
            sa.select(fm.id)
            .where(
                fm.status == int(FailedMessageStatus.RETRY_ISSUED),
                fm.queue_address == queue_address,
                fm.last_modified.between(start, end),
            )
            .order_by(fm.id)
        )
    )
