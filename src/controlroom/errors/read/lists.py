"""Pages of failed messages as the API and console list them: by filter and sort key,
a group's members, the queue addresses and the pending retries of a queue.

SQLAlchemy Core only, every value a bound parameter. Every function takes an open
``Connection`` so a caller can read a page and its total in one transaction. Times are
timezone-aware UTC.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from controlroom.db.providers import Provider, provider_for
from controlroom.db.tables import (
    GROUP_COPIES,
    GROUP_SORT_KEYS,
    STATUS_SORT_KEYS,
    SUBSET_SORT_KEYS,
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
    failed_in_queue,
    filter_conditions,
    order_by,
    sort_columns,
    status_and_group_only,
    status_conditions,
    subset_conditions,
)
from controlroom.errors.read.summaries import (
    SUMMARY_COLUMNS,
    FailedMessagePage,
    SearchPage,
    hits_page,
    to_summary,
)

fm = failed_messages.c


WALK_SORT_INDEX_PAST = 7_000
"""Past this many matching messages a list page outside any subset's index (statuses,
time ranges) is read by walking the sort key's index and filtering what it yields: the
filter's equality conditions (status) are kept from every index
(``Provider.without_index``), where a planner without statistics (SQLite) reads every
match from the condition's index and sorts them all (700,000 Unresolved of 1,000,000).
The walk tests about (offset + limit) x (all messages / matching messages) rows, reading
the matches costs one lookup each plus a sort: they cross near the square root of 50 x
all messages (7,000 at 1,000,000)."""


INDEXED_TYPE_BYTES = 1000
"""The longest message type (bytes of UTF-8) that an endpoint's and a queue address's
``(subset column, message_type, last_failure_at, id)`` indexes hold (partial, migrations
0032, 0036): beside a subset key of 1,600 bytes an entry stays within PostgreSQL's 2,704
bytes. Longer types have an index of the subset's column of their own (partial too)."""


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
    subset (a group, an endpoint, a queue address) is read from its own rows, never by
    walking an index of every message (docs/design.md "Reads at scale"): its page costs
    the same however many messages failed outside it since it stopped failing. Other
    lists of more than ``WALK_SORT_INDEX_PAST`` matches are found by walking the sort
    key's index.
    """
    provider = provider_for(conn)
    if where.group_id is not None:
        return _group_page(provider, where, order, offset=offset, limit=limit)
    if where.receiving_endpoint is not None or where.queue_address is not None:
        return _subset_page(provider, where, order, offset=offset, limit=limit)
    statuses = merged_statuses(where, order)
    if statuses and (total > WALK_SORT_INDEX_PAST or status_and_group_only(where)):
        others = replace(where, statuses=frozenset(), excluded_statuses=frozenset())
        conditions = filter_conditions(others, provider.without_index)
        return merged_walks(provider, conditions, statuses, order, offset=offset, limit=limit)
    if total > WALK_SORT_INDEX_PAST:
        conditions = filter_conditions(where, provider.without_index)
    else:
        conditions = filter_conditions(where)
    return _window(sa.select(fm.id).where(*conditions), provider, order, offset, limit)


STATUS_LED_WHEN_FILTERED = ("last_modified", "status", "id")
"""Sort columns (``None``: the id) with an index after the status as well as their own,
``(status, last_modified)`` and ``(status, id)``: a list naming statuses merges walks of
those, a list of every status walks the column's own index."""


def merged_statuses(where: FailedMessageFilter, order: Ordering) -> list[int]:
    """The statuses whose walks in ``order`` a page of ``where`` (filtered by no subset)
    merges, or none where it walks one index of every status: the sort key is indexed
    after the status alone (``STATUS_SORT_KEYS``, migration 0024), or besides
    (``STATUS_LED_WHEN_FILTERED``) and ``where`` names statuses."""
    key = _leading_key(order) or "id"
    named = bool(where.statuses or where.excluded_statuses)
    if key not in STATUS_SORT_KEYS and not (named and key in STATUS_LED_WHEN_FILTERED):
        return []
    chosen = where.statuses or frozenset(FailedMessageStatus)
    return sorted(int(s) for s in chosen - where.excluded_statuses)


def merged_walks(
    provider: Provider,
    conditions: list[sa.ColumnElement[bool]],
    statuses: list[int],
    order: Ordering,
    *,
    offset: int,
    limit: int,
) -> sa.Subquery:
    """The messages (their ``sort_columns``) among ``statuses`` matching ``conditions``
    in ``order``, ``limit`` from ``offset``, as a subquery: one walk per status of its
    ``(status, key, id)`` index (by message type ``(status, message_type,
    last_failure_at, id)``), merged by a compound ``ORDER BY`` (UNION ALL). Each walk
    reads its own status's rows, never another's: a status's page costs the same however
    many messages of other statuses are newer (docs/decisions.md "A subset is read from
    its own rows"). PostgreSQL merges the walks, each bounded by the page's end
    (``Provider.bounds_merged_walks``), SQLite too (a compound ``SELECT`` with ``ORDER
    BY`` runs its parts as co-routines, each in index order): a page reads about as many
    rows as one walk of every message did."""
    walks = [
        sa.select(*sort_columns(order)).where(fm.status == status, *conditions)
        for status in statuses
    ]
    return merge_walks(provider, walks, order, offset=offset, limit=limit)


def merge_walks(
    provider: Provider,
    walks: list[sa.Select[Any]],
    order: Ordering,
    *,
    offset: int,
    limit: int,
) -> sa.Subquery:
    """The rows of ``walks`` (each selecting ``sort_columns(order)``, none ordered) in
    ``order``, ``limit`` from ``offset``, as a subquery: a compound ``SELECT`` ordered as a
    whole, which reads each walk in order and merges them, each bounded by the page's
    end where the provider needs it said (``Provider.bounds_merged_walks``)."""
    if provider.bounds_merged_walks and len(walks) > 1:
        bounded = [
            walk.order_by(*order_by(provider, order)).limit(offset + limit).subquery(f"s{n}")
            for n, walk in enumerate(walks)
        ]
        walks = [sa.select(*walk.c) for walk in bounded]
    merged = walks[0] if len(walks) == 1 else sa.union_all(*walks)
    ordered = merged.order_by(*order_by(provider, order, merged.selected_columns))
    return ordered.limit(limit).offset(offset).subquery("page")


def _window(
    ids: sa.Select[Any], provider: Provider, order: Ordering, offset: int, limit: int
) -> sa.Subquery:
    """``ids`` (of ``failed_messages``) in ``order``, ``limit`` from ``offset``."""
    return ids.order_by(*order_by(provider, order)).limit(limit).offset(offset).subquery("page")


def _fenced_window(
    members: sa.Select[Any], provider: Provider, order: Ordering, offset: int, limit: int
) -> sa.Subquery:
    """The ids of ``members`` (which selects ``sort_columns(order)``, the id as ``id``) in
    ``order``, ``limit`` from ``offset``, ``members`` read on their own and sorted
    (``Provider.fenced``): a page bounded by the members, whatever the planner guesses of
    their number. Their rows stream into a sort that keeps the page's end (offset +
    limit rows), never the members whole."""
    fenced = provider.fenced(members, "members")
    return _members_window(fenced.c, sa.select(fenced.c.id), provider, order, offset, limit)


def _members_window(
    columns: sa.ColumnCollection[str, Any],
    ids: sa.Select[Any],
    provider: Provider,
    order: Ordering,
    offset: int,
    limit: int,
) -> sa.Subquery:
    """``ids`` in ``order`` by the sort ``columns`` of the members they are read from,
    ``limit`` from ``offset``."""
    ordered = ids.order_by(*order_by(provider, order, columns))
    return ordered.limit(limit).offset(offset).subquery("page")


def _leading_key(order: Ordering) -> str | None:
    """The name of the column ``order`` sorts by before the id (``None``: the id)."""
    keys = [column.name for column in sort_columns(order) if column is not fm.id]
    return keys[0] if keys else None


def _group_page(
    provider: Provider, where: FailedMessageFilter, order: Ordering, *, offset: int, limit: int
) -> sa.Subquery:
    """A group's page, from its group rows alone when they hold the sort key's copy and
    ``where`` filters by statuses only: walking ``(group_id, key, failed_message_id)`` (by
    message type ``(group_id, message_type, last_failure_at, failed_message_id)``) in
    order for the keys of ``GROUP_SORT_KEYS``, else its rows read and sorted; any other
    filter joins its rows to their messages, read and sorted."""
    if not _group_rows_hold(where, order):
        return _fenced_window(_members_joined(where, order), provider, order, offset, limit)
    if _leading_key(order) in GROUP_SORT_KEYS:
        members = _members_from_group_rows(where, order, provider.without_index).subquery()
        ids = sa.select(members.c.id)
        return _members_window(members.c, ids, provider, order, offset, limit)
    return _fenced_window(_members_from_group_rows(where, order), provider, order, offset, limit)


def _subset_page(
    provider: Provider, where: FailedMessageFilter, order: Ordering, *, offset: int, limit: int
) -> sa.Subquery:
    """The page of an endpoint or a queue address (``where`` names one or both): walking
    ``(subset column, key, id)`` in order for the keys of ``SUBSET_SORT_KEYS``; by message
    type, the walk of ``(subset column, message_type, last_failure_at, id)`` over the
    types of at most ``INDEXED_TYPE_BYTES`` merged with the subset's longer types sorted;
    else the subset's rows read by its ``time_sent`` index and sorted. The status and the
    other equality conditions are kept from every index (``subset_conditions``), so no
    planner reads another column's matches instead: a status's index, walked for an
    endpoint holding a third of the messages, passed every newer message of that status
    elsewhere."""
    conditions = subset_conditions(where, provider)
    key = _leading_key(order)
    if key in SUBSET_SORT_KEYS:
        return _window(sa.select(fm.id).where(*conditions), provider, order, offset, limit)
    if key == "message_type":
        octets = sa.func.coalesce(provider.octet_length(fm.message_type), sa.literal_column("0"))
        bound: sa.ColumnElement[int] = sa.literal_column(str(INDEXED_TYPE_BYTES))  # as indexed
        walks = [
            sa.select(*sort_columns(order)).where(*conditions, within)
            for within in (octets <= bound, octets > bound)
        ]
        return merge_walks(provider, walks, order, offset=offset, limit=limit)
    members = sa.select(*sort_columns(order)).where(*conditions)
    return _fenced_window(members, provider, order, offset, limit)


def _group_rows_hold(where: FailedMessageFilter, order: Ordering) -> bool:
    """True when the group rows alone answer a page of ``where`` in ``order``: it filters
    by a group and statuses only, and sorts by columns the group rows hold a copy of
    (``GROUP_COPIES``)."""
    keys = [column.name for column in sort_columns(order) if column is not fm.id]
    return status_and_group_only(where) and all(key in GROUP_COPIES for key in keys)


def _members_from_group_rows(
    where: FailedMessageFilter,
    order: Ordering,
    status_operand: Callable[[sa.ColumnElement[Any]], sa.ColumnElement[Any]] = lambda c: c,
) -> sa.Select[Any]:
    """The ids and sort keys of a group's messages matching ``where``, read from its
    group rows and their copies of the sort key, equal to the message's in every
    committed state (migrations 0011, 0013, 0020): one group-row read per member, where
    joining the messages cost a primary-key probe and a message row each. The status
    copy as ``status_operand`` gives it."""
    groups = failed_message_groups.c
    copies = [
        groups.failed_message_id.label("id") if column is fm.id else groups[column.name]
        for column in sort_columns(order)
    ]
    return sa.select(*copies).where(
        groups.group_id == where.group_id, *status_conditions(status_operand(groups.status), where)
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
                failed_in_queue(queue_address),
                fm.last_modified.between(start, end),
            )
            .order_by(fm.id)
        )
    )
