"""The read side of the error instance: failed messages as the API and console show them.

SQLAlchemy Core only, every value a bound parameter. Every function takes an open
``Connection`` so a caller can read a page and its total in one transaction. Times are
timezone-aware UTC; sizes are bytes.

Lists are filtered by a ``FailedMessageFilter`` and ordered by an ``Ordering``: one of
ServiceControl's sort keys, then the id in the same direction, so equal keys never make
pages overlap or skip rows. An empty value (no ``message_type``, no ``time_sent``) sorts
as the smallest: first ascending, last descending, on every provider.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, get_args

import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.db.tables import (
    GROUP_COPIES,
    FailedMessageStatus,
    failed_error_imports,
    failed_message_group_counts,
    failed_message_groups,
    failed_messages,
)
from controlroom.errors import tallies
from controlroom.errors.ingest.headers import content_encoding
from controlroom.errors.ingest.search_terms import query_search_terms
from controlroom.errors.model import FailureGroup

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

BROAD_SEARCH_ESTIMATE = 5
"""A search whose matches in a sample of the messages (``SEARCH_SAMPLE``) come to this
many times the exact-count limit or more is a broad search: its page is looked for among
the first rows of the sort order and nothing is counted (``_page_of_a_broad_search``). At
the default limit and 1,000,000 messages: 5 % of them, 25 of the sample."""

SEARCH_SAMPLE = 500
"""The messages a broad search is sampled on: the first by id. Ids are UniqueMessageIds,
digests of the message id and endpoint (``errors.ingest.identity``), unrelated to content,
time or storage: a random sample, so a burst of recent matches, or matches stored first,
do not pass for many (a store of sequential ids would have no such sample)."""

SEARCH_SAMPLE_MATCHES = 10
"""The fewest matches in the sample that count as evidence (below, chance decides)."""

BROAD_SEARCH_WINDOW = 40
"""How many rows of the sort order per row up to the page's end a broad search's page is
looked for in: twice what a search matching 5 % of the messages needs. Where the window
holds no full page, testing it was wasted: about 2,000 rows for a first page of 50."""

BROAD_SEARCH_WINDOW_MAX = 20_000
"""No window past this many rows: a deeper page of a broad search counts first, and a
search of many matches walks the sort order unbounded (``_search_page_of_many``)."""

EDIT_OF_HEADER = "ServiceControl.EditOf"
"""Header naming the failed message an edited-and-retried message was made from."""

Operand = Callable[[sa.ColumnElement[Any]], sa.ColumnElement[Any]]

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


@dataclass(frozen=True, slots=True)
class FailedMessageSummary:
    """One failed message as a list shows it: the stored (newest) attempt's columns."""

    id: str  # UniqueMessageId
    message_id: str
    message_type: str | None
    time_sent: datetime | None
    is_system_message: bool
    exception_type: str | None
    exception_message: str | None
    exception_source: str | None
    stack_trace: str | None
    number_of_processing_attempts: int
    status: FailedMessageStatus
    sending_endpoint: str | None
    sending_host_id: str | None
    sending_host: str | None
    receiving_endpoint: str
    receiving_host_id: str | None
    receiving_host: str | None
    queue_address: str
    last_failure_at: datetime  # the stored attempt's time of failure
    last_modified: datetime


@dataclass(frozen=True, slots=True)
class FailedMessageDetails:
    """One failed message in full: the summary, its headers, failure window and groups."""

    summary: FailedMessageSummary
    headers_json: str  # the stored source of truth, a JSON object
    first_failure_at: datetime
    conversation_id: str | None
    content_type: str
    body_size: int  # true size in bytes, wherever the body is kept
    groups: tuple[FailureGroup, ...]  # ordered by classifier, then title


@dataclass(frozen=True, slots=True)
class LastFailedMessage:
    """A failed message as ``errors/last/{id}`` shows it: the summary and, when the stored
    attempt is an edited copy of another failed message, that message's id."""

    summary: FailedMessageSummary
    edit_of: str | None  # value of ServiceControl.EditOf, None when not an edited copy


@dataclass(frozen=True, slots=True)
class SearchHit:
    """A failed message found by full-text search, with what a message list shows."""

    summary: FailedMessageSummary
    conversation_id: str | None
    headers_json: str  # the stored source of truth, a JSON object
    body_size: int  # bytes


@dataclass(frozen=True, slots=True)
class StoredBody:
    """Where a failed message's body is: inline text, or a key in the body store.

    When ``stored_externally`` the body store holds the authoritative copy under ``key``
    and ``text`` is only a searchable prefix (DESIGN.md "Body placement").
    """

    content_type: str
    size: int
    text: str | None
    stored_externally: bool
    key: str | None
    content_encoding: str | None = None  # the body's encoding (gzip, ...), None when plain


@dataclass(frozen=True, slots=True)
class FailedMessagePage:
    """One page of failed messages and the total over all pages."""

    total: int
    items: list[FailedMessageSummary]
    total_estimated: bool = False
    """``total`` is the database's estimate (``count_matching``), not a count."""


@dataclass(frozen=True, slots=True)
class SearchPage:
    """One page of search hits and the total over all pages."""

    total: int
    items: list[SearchHit]
    total_estimated: bool = False
    """``total`` is the database's estimate (``count_matching``), not a count."""


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


_SUMMARY_COLUMNS = (
    fm.id,
    fm.message_id,
    fm.message_type,
    fm.time_sent,
    fm.is_system_message,
    fm.exception_type,
    fm.exception_message,
    fm.exception_source,
    fm.stack_trace,
    fm.number_of_processing_attempts,
    fm.status,
    fm.sending_endpoint,
    fm.sending_host_id,
    fm.sending_host,
    fm.receiving_endpoint,
    fm.receiving_host_id,
    fm.receiving_host,
    fm.queue_address,
    fm.last_failure_at,
    fm.last_modified,
)


# --- lists --------------------------------------------------------------------------------
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
    _check_window(offset, limit)
    total = count_matching(conn, where, exact_count_limit)
    page = _page_ids(conn, where, order, offset=offset, limit=limit, total=total.value)
    rows = conn.execute(
        sa.select(*_SUMMARY_COLUMNS)
        .join_from(failed_messages, page, fm.id == page.c.id)
        .order_by(*order_by(order))
    ).all()
    total = total.at_least_seen(offset, len(rows), limit)
    return FailedMessagePage(
        total=total.value,
        items=[_summary(row) for row in rows],
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
    if where.group_id is not None and total <= GROUP_IDS_FIRST:
        # Fenced in a materialized CTE: given the same condition as a membership test,
        # the planner may still walk the sort key's index probing each message (0.7 s
        # for a group of 5,946 among 1,000,000, benchmarks/query.py).
        members = (
            (
                _members_from_group_rows(where, order)
                if _group_rows_hold(where, order)
                else _members_joined(where, order)
            )
            .cte("members")
            .prefix_with("MATERIALIZED")
        )
        return (
            sa.select(members.c.id)
            .order_by(*order_by(order, members.c))
            .limit(limit)
            .offset(offset)
            .subquery("page")
        )
    if total > WALK_SORT_INDEX_PAST:
        conditions = filter_conditions(where, provider_for(conn).without_index)
    else:
        conditions = filter_conditions(where)
    return (
        sa.select(fm.id)
        .where(*conditions)
        .order_by(*order_by(order))
        .limit(limit)
        .offset(offset)
        .subquery("page")
    )


def _group_rows_hold(where: FailedMessageFilter, order: Ordering) -> bool:
    """True when the group rows alone answer a page of ``where`` in ``order``: it filters
    by a group and statuses only, and sorts by columns the group rows hold a copy of
    (``GROUP_COPIES``: time of failure, status)."""
    keys = [column.name for column in sort_columns(order) if column is not fm.id]
    return _status_and_group_only(where) and all(key in GROUP_COPIES for key in keys)


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
        groups.group_id == where.group_id, *_status_conditions(groups.status, where)
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


@dataclass(frozen=True, slots=True)
class Total:
    """How many rows match: ``value`` exact, or the database's estimate when
    ``estimated`` (then never below the exact-count limit + 1)."""

    value: int
    estimated: bool = False

    def at_least_seen(self, offset: int, rows: int, limit: int) -> Total:
        """An estimate raised to what a page read from ``offset`` showed: its ``rows``,
        and one more when it was full (``limit``), so a client paging by ``Link`` always
        finds the next page even where the planner's estimate falls short (two words it
        takes for independent). A page with fewer rows than ``limit`` ends the matches:
        then the total is exact (``offset`` + ``rows``), unless the page is empty past
        the first (it may lie beyond the end). An exact total is returned as it is."""
        if not self.estimated:
            return self
        if rows < limit and (rows > 0 or offset == 0):
            return Total(offset + rows)
        seen = offset + rows + (1 if rows == limit else 0)
        return Total(max(self.value, seen), estimated=True)


def count_failed_messages(conn: sa.Connection, where: FailedMessageFilter = EVERY_MESSAGE) -> int:
    """How many failed messages match ``where``, exactly: from a group's
    counts when ``where`` filters by a group and statuses only, from the tallies
    (``errors.tallies``) when ``where`` filters by nothing they do not hold (statuses,
    system messages, receiving endpoint), else by counting the matching rows."""
    counted = _group_count(conn, where)
    if counted is None:
        counted = _tallied_count(conn, where)
    return counted if counted is not None else _count(conn, _matching_rows(where))


def _tallied_count(conn: sa.Connection, where: FailedMessageFilter) -> int | None:
    """How many failed messages match ``where`` by the tallies; ``None`` when ``where``
    filters by something they do not count by."""
    others = replace(
        where,
        statuses=frozenset(),
        excluded_statuses=frozenset(),
        include_system_messages=True,
        receiving_endpoint=None,
    )
    if others != EVERY_MESSAGE:
        return None

    def conditions(c: sa.ColumnCollection[str, Any]) -> list[sa.ColumnElement[bool]]:
        found = _status_conditions(c.status, where)
        if not where.include_system_messages:
            found.append(c.is_system_message.is_(False))
        if where.receiving_endpoint is not None:
            found.append(c.receiving_endpoint == where.receiving_endpoint)
        return found

    tallies.fold_deltas_if_many(conn)
    rows = tallies.tally_rows(conditions).subquery("tallied")
    total = sa.select(sa.func.coalesce(sa.func.sum(rows.c.messages), 0))
    return int(conn.execute(total).scalar_one())


def count_matching(
    conn: sa.Connection, where: FailedMessageFilter, exact_count_limit: int | None
) -> Total:
    """How many failed messages match ``where``: exact up to ``exact_count_limit`` (``None``:
    always exact), beyond it the provider's estimate (``Provider.estimate_rows``) raised to
    at least the limit + 1; exact again where the provider has no estimate (SQLite), then
    from the tallies where ``where`` allows (``count_failed_messages``): the first page of
    ``/api/errors`` on SQLite no longer counts every message.

    An exact count reads every matching row (3-5 s for 152,000 search hits among
    1,000,000 on PostgreSQL, ``benchmarks/query.py``); a count stopped after the limit + 1
    reads at most that many, and the estimate none. Exact at any size where the database
    keeps the count: a group's messages filtered by status alone (the group counts,
    migration 0014), and messages filtered by statuses, system messages and receiving
    endpoint only (the tallies, migration 0012).
    """
    counted = _group_count(conn, where)
    if counted is None:
        counted = _tallied_count(conn, where)
    if counted is not None:
        return Total(counted)
    return _count_or_estimate(conn, _matching_rows(where), exact_count_limit)


def _group_count(conn: sa.Connection, where: FailedMessageFilter) -> int | None:
    """The exact number of a group's messages when ``where`` filters by nothing but a
    group and statuses: the sum of the group's counts per status, kept by the database
    (``failed_message_group_counts``); ``None`` for any other filter."""
    if where.group_id is None or not _status_and_group_only(where):
        return None
    counts = failed_message_group_counts.c
    total = sa.select(sa.func.coalesce(sa.func.sum(counts.n), 0)).where(
        counts.group_id == where.group_id, *_status_conditions(counts.status, where)
    )
    return int(conn.execute(total).scalar_one())


def _count_or_estimate(
    conn: sa.Connection, rows: sa.Select[Any], exact_count_limit: int | None
) -> Total:
    if exact_count_limit is None:
        return Total(_count(conn, rows))
    counted = _count(conn, rows.limit(exact_count_limit + 1))
    if counted <= exact_count_limit:
        return Total(counted)
    estimate = provider_for(conn).estimate_rows(conn, rows)
    if estimate is None:
        return Total(_count(conn, rows))
    return Total(max(estimate, exact_count_limit + 1), estimated=True)


def _count(conn: sa.Connection, rows: sa.Select[Any]) -> int:
    query = sa.select(sa.func.count()).select_from(rows.subquery("matching"))
    return int(conn.execute(query).scalar_one())


def _matching_rows(where: FailedMessageFilter) -> sa.Select[Any]:
    """One row for each failed message matching ``where``, to be counted."""
    return sa.select(sa.literal(1)).select_from(failed_messages).where(*filter_conditions(where))


def _status_and_group_only(where: FailedMessageFilter) -> bool:
    """True when ``where`` filters by nothing but statuses and a group."""
    others = replace(where, statuses=frozenset(), excluded_statuses=frozenset(), group_id=None)
    return others == EVERY_MESSAGE


def _status_conditions(
    column: sa.ColumnElement[Any], where: FailedMessageFilter
) -> list[sa.ColumnElement[bool]]:
    conditions: list[sa.ColumnElement[bool]] = []
    if where.statuses:
        conditions.append(column.in_(sorted(int(s) for s in where.statuses)))
    if where.excluded_statuses:
        conditions.append(column.not_in(sorted(int(s) for s in where.excluded_statuses)))
    return conditions


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
    _check_window(offset, limit)
    total = count_matching(conn, where, exact_count_limit)
    page = _page_ids(conn, where, order, offset=offset, limit=limit, total=total.value)
    return _hits_page(conn, page, order, total, offset=offset, limit=limit)


def _hits_page(
    conn: sa.Connection,
    page: sa.Subquery,
    order: Ordering,
    total: Total,
    *,
    offset: int,
    limit: int,
) -> SearchPage:
    """The rows of ``page`` (a subquery of ids) with what the message views show, in
    ``order``, and ``total`` raised to what they show (``Total.at_least_seen``)."""
    rows = conn.execute(
        sa.select(*_SUMMARY_COLUMNS, fm.conversation_id, fm.headers_json, fm.body_size)
        .join_from(failed_messages, page, fm.id == page.c.id)
        .order_by(*order_by(order))
    ).all()
    total = total.at_least_seen(offset, len(rows), limit)
    return SearchPage(
        total=total.value, items=[_hit(row) for row in rows], total_estimated=total.estimated
    )


@dataclass(frozen=True, slots=True)
class FacetValue:
    """One value of a facet and how many failed messages have it."""

    value: str
    count: int


FACETS = {
    "endpoint": "receiving_endpoint",
    "host": "receiving_host",
    "message_type": "message_type",
}
"""The summary's facets and the column each counts."""


def unresolved_facets(conn: sa.Connection) -> dict[str, list[FacetValue]]:
    """The Unresolved failed messages counted by receiving endpoint (``"endpoint"``), its
    host (``"host"``) and message type (``"message_type"``), most frequent first, then by
    value; messages without the value are not counted. Source: ServiceControl
    ``FailedMessageFacetsIndex``.

    One statement over the tallies (``errors.tallies``), so the three facets are of one
    committed state; grouping every Unresolved message took ~2 s at 1,000,000 (issue 13).
    """
    tallies.fold_deltas_if_many(conn)
    rows = _unresolved_tally_rows().cte("unresolved")
    parts = []
    for facet, (name, column) in enumerate(FACETS.items()):
        count = sa.func.sum(rows.c.messages)
        parts.append(
            sa.select(
                sa.literal(facet).label("facet"),
                sa.literal(name).label("name"),
                rows.c[column].label("value"),
                count.label("n"),
            )
            .where(rows.c[column].is_not(None))
            .group_by(rows.c[column])
            .having(count > 0)
        )
    facets: dict[str, list[FacetValue]] = {name: [] for name in FACETS}
    ordered = sa.union_all(*parts).subquery("facets")
    for row in conn.execute(
        sa.select(ordered.c.name, ordered.c.value, ordered.c.n).order_by(
            ordered.c.facet, ordered.c.n.desc(), ordered.c.value
        )
    ):
        facets[row.name].append(FacetValue(value=row.value, count=int(row.n)))
    return facets


def filter_conditions(
    where: FailedMessageFilter, equality_operand: Operand = lambda column: column
) -> list[sa.ColumnElement[bool]]:
    """The WHERE conditions of ``where`` over ``failed_messages`` (to be ANDed); the
    columns of its equality conditions (status, queue address, receiving endpoint) as
    ``equality_operand`` gives them."""
    conditions = _status_conditions(equality_operand(fm.status), where)
    if where.modified_from is not None:
        conditions.append(fm.last_modified >= where.modified_from)
    if where.modified_to is not None:
        conditions.append(fm.last_modified <= where.modified_to)
    if where.failed_from is not None:
        conditions.append(fm.last_failure_at >= where.failed_from)
    if where.failed_to is not None:
        conditions.append(fm.last_failure_at <= where.failed_to)
    if where.queue_address is not None:
        # Both sides folded by the database, so they fold alike (SQLite folds ASCII only).
        conditions.append(
            sa.func.lower(equality_operand(fm.queue_address))
            == sa.func.lower(sa.literal(where.queue_address))
        )
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


def order_by(
    order: Ordering, columns: sa.ColumnCollection[str, Any] | None = None
) -> list[sa.ColumnElement[Any]]:
    """ORDER BY clauses for ``order``: the key, then the id in the same direction.

    ``columns`` are those of a subquery or CTE that selected ``sort_columns(order)``;
    by default ``failed_messages``' own. Empty values sort as the smallest on every
    provider (PostgreSQL would put them last ascending); the PostgreSQL indexes of the
    sort keys are built in this order (migration 0004).
    """
    source = columns if columns is not None else failed_messages.c
    ordered: list[sa.ColumnElement[Any]] = []
    for column in sort_columns(order):
        clause = source[column.name]
        if order.descending:
            element = clause.desc().nulls_last() if column.nullable else clause.desc()
        else:
            element = clause.asc().nulls_first() if column.nullable else clause.asc()
        ordered.append(element)
    return ordered


def sort_columns(order: Ordering) -> list[sa.Column[Any]]:
    """The ``failed_messages`` columns ``order`` sorts by: the key's, then the id."""
    column = _SORT_COLUMNS[order.key]
    return [column] if column is fm.id else [column, fm.id]


def count_by_status(conn: sa.Connection) -> dict[FailedMessageStatus, int]:
    """How many failed messages there are in each status (every status present, maybe 0).

    Read from the tallies the database keeps (``errors.tallies``, migration 0012): equal
    to counting the messages, at the cost of a few thousand rows (issue 13)."""
    tallies.fold_deltas_if_many(conn)
    rows = tallies.tally_rows().subquery("tallied")
    counts = dict.fromkeys(FailedMessageStatus, 0)
    for status, count in conn.execute(
        sa.select(rows.c.status, sa.func.sum(rows.c.messages)).group_by(rows.c.status)
    ):
        if count:
            counts[FailedMessageStatus(status)] = int(count)
    return counts


def count_unresolved_by_endpoint(conn: sa.Connection) -> dict[str, int]:
    """How many Unresolved failed messages each receiving endpoint has; endpoints with
    none are absent. Ordered by count, largest first, then by name. From the tallies, as
    ``count_by_status``."""
    tallies.fold_deltas_if_many(conn)
    rows = _unresolved_tally_rows().subquery("unresolved")
    failures = sa.func.sum(rows.c.messages).label("failures")
    found = conn.execute(
        sa.select(rows.c.receiving_endpoint, failures)
        .group_by(rows.c.receiving_endpoint)
        .having(failures > 0)
        .order_by(sa.desc("failures"), rows.c.receiving_endpoint)
    ).all()
    return {row.receiving_endpoint: int(row.failures) for row in found}


def count_unresolved_by_endpoint_instance(
    conn: sa.Connection,
) -> dict[tuple[str, str | None], int]:
    """How many Unresolved failed messages each endpoint instance (receiving endpoint and
    its host id, the key of a known endpoint) has; instances with none are absent. From
    the tallies, as ``count_by_status``."""
    tallies.fold_deltas_if_many(conn)
    rows = _unresolved_tally_rows().subquery("unresolved")
    failures = sa.func.sum(rows.c.messages).label("failures")
    found = conn.execute(
        sa.select(rows.c.receiving_endpoint, rows.c.receiving_host_id, failures)
        .group_by(rows.c.receiving_endpoint, rows.c.receiving_host_id)
        .having(failures > 0)
    ).all()
    return {(row.receiving_endpoint, row.receiving_host_id): int(row.failures) for row in found}


def _unresolved_tally_rows() -> sa.CompoundSelect[Any]:
    return tallies.tally_rows(lambda c: [c.status == int(FailedMessageStatus.UNRESOLVED)])


def count_failed_imports(conn: sa.Connection) -> int:
    """How many messages are kept as failed imports (waiting to be re-imported)."""
    query = sa.select(sa.func.count()).select_from(failed_error_imports)
    return int(conn.execute(query).scalar_one())


def list_queue_addresses(conn: sa.Connection, *, offset: int, limit: int) -> QueueAddressPage:
    """The distinct queue addresses (``NServiceBus.FailedQ``) of failed messages, each with
    its count of failed messages in any status, by address; ``limit`` from ``offset``.

    Source: ServiceControl ``QueueAddressIndex`` (a count over every failed message).
    Raises ``ValueError`` for a negative ``offset`` or a ``limit`` below 1.
    """
    _check_window(offset, limit)
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


# --- full-text search ---------------------------------------------------------------------
def search_failed_messages(
    conn: sa.Connection,
    text: str,
    *,
    offset: int,
    limit: int,
    order: Ordering = Ordering(),
    where: FailedMessageFilter = EVERY_MESSAGE,
    exact_count_limit: int | None = None,
) -> SearchPage:
    """Failed messages whose headers or body text contain ``text`` (the provider's
    full-text index over the terms of ``errors.ingest.search_terms``: every term of
    ``text`` must occur), or whose message id is ``text``, or whose id
    (UniqueMessageId) is ``text`` when it is a UUID, among those matching ``where``; in
    ``order``, with the total: exact, or past ``exact_count_limit`` an estimate
    (``_total_past_limit``).

    Raises ``ValueError`` for a negative ``offset`` or a ``limit`` below 1.
    """
    _check_window(offset, limit)
    condition = sa.and_(search_condition(conn.dialect, text), *filter_conditions(where))
    provider = provider_for(conn)
    provider.prepare_search(conn)
    if exact_count_limit is None:
        return _search_page(conn, condition, offset, limit, order)
    matching = sa.select(sa.literal(1)).select_from(failed_messages).where(condition)
    broad = _page_of_a_broad_search(
        conn, condition, matching, exact_count_limit, offset, limit, order
    )
    if broad is not None:
        return broad
    terms = query_search_terms(text)
    hits = provider.count_search_hits(conn, terms, exact_count_limit)
    if hits is not None and hits <= exact_count_limit:
        # Few by the terms; the id alternatives add a handful, which the page counts.
        return _search_page(conn, condition, offset, limit, order)
    if hits is None or where != EVERY_MESSAGE:
        few = _search_page(conn, condition, offset, limit, order, cap=exact_count_limit + 1)
        if few.total <= exact_count_limit:
            return few
    total = _total_past_limit(conn, terms, matching, where, exact_count_limit, hits is not None)
    return _search_page_of_many(conn, text, where, condition, total, offset, limit, order)


def _page_of_a_broad_search(
    conn: sa.Connection,
    condition: sa.ColumnElement[bool],
    matching: sa.Select[Any],
    exact_count_limit: int,
    offset: int,
    limit: int,
    order: Ordering,
) -> SearchPage | None:
    """The page of a broad search with its estimated total, or ``None`` (the caller
    counts, as for any search).

    Broad: the provider estimates more than the exact-count limit (a cheap gate: SQLite
    has no such estimate), and the matches among ``SEARCH_SAMPLE`` messages spread over
    the ids, scaled to every message, come to ``BROAD_SEARCH_ESTIMATE`` x the limit or
    more, from at least ``SEARCH_SAMPLE_MATCHES`` of them. That scaled figure is the
    total, marked estimated; a sample holding every message is exact but still marked.
    The page is then looked for in the first ``BROAD_SEARCH_WINDOW`` x (``offset`` +
    ``limit``) rows of the sort order; no full page there gives ``None`` too.

    Counting even up to the limit builds the index's bitmap of every candidate first
    (PostgreSQL's GIN: 287,000 of 1,000,000 messages, 60-450 ms, ``benchmarks/query.py``);
    this tests the sample and the window's rows one by one. The sample, not the
    planner, says "many": the planner takes words for independent (four messages
    saying both "alpha" and "beta" were estimated at 78, break-it pass)."""
    window_rows = BROAD_SEARCH_WINDOW * (offset + limit)
    estimate = provider_for(conn).estimate_rows(conn, matching)
    if estimate is None or estimate <= exact_count_limit or window_rows > BROAD_SEARCH_WINDOW_MAX:
        return None
    sample = sa.select(fm.id).order_by(fm.id).limit(SEARCH_SAMPLE).subquery("sample")
    sampled = conn.execute(
        sa.select(sample.c.id)
        .join_from(sample, failed_messages, fm.id == sample.c.id)
        .where(condition)
    ).all()
    messages = count_failed_messages(conn)
    scaled = round(len(sampled) * messages / max(min(SEARCH_SAMPLE, messages), 1))
    if len(sampled) < SEARCH_SAMPLE_MATCHES or scaled < BROAD_SEARCH_ESTIMATE * exact_count_limit:
        return None
    page = _window_page(condition, _window(order, window_rows), order, offset=offset, limit=limit)
    total = Total(scaled, estimated=True)
    found = _hits_page(conn, page, order, total, offset=offset, limit=limit)
    return found if len(found.items) == limit else None


def _window(order: Ordering, rows: int) -> sa.Select[Any]:
    """The first ``rows`` messages of the sort order (their sort keys and ids)."""
    return sa.select(*sort_columns(order)).order_by(*order_by(order)).limit(rows)


def _window_page(
    condition: sa.ColumnElement[bool],
    window: sa.Select[Any],
    order: Ordering,
    *,
    offset: int,
    limit: int,
) -> sa.Subquery:
    """The ids of the page among the messages of ``window`` (``_window``) matching
    ``condition``: each of those rows tested in turn, until the page is full. The window
    is a subquery with its own LIMIT, so the planner keeps its order (the page stops
    early) and cannot collect every match from the condition's index instead."""
    rows = window.subquery("window")
    return (
        sa.select(rows.c.id)
        .join_from(rows, failed_messages, fm.id == rows.c.id)
        .where(condition)
        .order_by(*order_by(order, rows.c))
        .limit(limit)
        .offset(offset)
        .subquery("page")
    )


def _total_past_limit(
    conn: sa.Connection,
    terms: Sequence[str],
    matching: sa.Select[Any],
    where: FailedMessageFilter,
    exact_count_limit: int,
    counted_in_index: bool,
) -> Total:
    """The total of a search of ``terms`` (``matching``: a row per match, its filter
    ``where``) known to have more matches than ``exact_count_limit``.

    Where the provider counted the terms' hits in its full-text index alone
    (``counted_in_index``: ``Provider.count_search_hits``, SQLite) and nothing else
    filters, the index's own estimate (``Provider.estimate_search_hits``); otherwise the
    provider's estimate of ``matching`` (``Provider.estimate_rows``), or, where it has
    none, the exact count. An estimate is raised to the limit + 1 and marked, as
    ``count_matching`` marks one. Counting every match read each one's table row: 5 s for
    287,000 of 1,000,000 (``benchmarks/README.md``).
    """
    provider = provider_for(conn)
    if counted_in_index and where == EVERY_MESSAGE:
        estimate = provider.estimate_search_hits(conn, terms)
        if estimate is not None:
            return Total(max(estimate, exact_count_limit + 1), estimated=True)
    estimate = provider.estimate_rows(conn, matching)
    if estimate is None:
        return Total(_count(conn, matching))
    return Total(max(estimate, exact_count_limit + 1), estimated=True)


def _search_page_of_many(
    conn: sa.Connection,
    text: str,
    where: FailedMessageFilter,
    collected: sa.ColumnElement[bool],
    total: Total,
    offset: int,
    limit: int,
    order: Ordering,
) -> SearchPage:
    """A page of a search of ``text`` among ``where`` (as one condition: ``collected``,
    the form that collects every match) with more matches than the
    exact-count limit: walking the sort key's index and testing each row finds a page
    after about (offset + limit) x (all messages / matches) rows, where collecting every
    match first read them all. The condition is kept from every index
    (``Provider.without_index``): SQLite, having no statistics, would otherwise collect
    every match by its indexes and sort them all.

    That many assumes matches spread evenly in time; failures come in bursts. So where it
    is at most ``BROAD_SEARCH_WINDOW_MAX``, the walk stops after twice that many rows (plus
    a page), and a page not full by then is read from the collected matches instead, with
    their exact count: an old burst of 4,000 of 20,000 messages cost 1.7 s by lookups
    walked to its end, 0.07 s collected (break-it pass). The bounded walk's window goes to
    the provider with the condition (``search_condition``'s ``among``): SQLite then reads
    only the hits within the window's rowid range."""
    tested = math.ceil((offset + limit) * count_failed_messages(conn) / max(total.value, 1))
    bound = 2 * tested + limit
    if bound <= BROAD_SEARCH_WINDOW_MAX:
        window = _window(order, bound)
        condition = sa.and_(
            search_condition(conn.dialect, text, among=window), *filter_conditions(where)
        )
        page = _window_page(condition, window, order, offset=offset, limit=limit)
        found = _hits_page(conn, page, order, total, offset=offset, limit=limit)
        if len(found.items) == limit:
            return found
        return _search_page(conn, collected, offset, limit, order)
    walked = (
        sa.select(fm.id)
        .where(provider_for(conn).without_index(collected))
        .order_by(*order_by(order))
        .limit(limit)
        .offset(offset)
        .subquery("page")
    )
    return _hits_page(conn, walked, order, total, offset=offset, limit=limit)


def _search_page(
    conn: sa.Connection,
    condition: sa.ColumnElement[bool],
    offset: int,
    limit: int,
    order: Ordering,
    *,
    cap: int | None = None,
) -> SearchPage:
    """The page of the matches of ``condition`` and their exact number, from the matches
    collected in one pass; with ``cap``, at most that many are collected, and a total of
    ``cap`` means "at least ``cap``" (the page is then not the page: the caller's search
    has many matches). Counting first, up to the limit, and collecting after read the
    same matches twice (``tests/integration/test_list_pages.py``)."""
    # One pass over the matches, fenced off in a materialized CTE: the planner would
    # otherwise walk a sort key's index and test the full-text condition row by row
    # (detoasting every search_vector on PostgreSQL: 15 s for a term in 7,000 of
    # 1,000,000 rows), as it cannot see what that test costs. From the matches (ids and
    # sort keys only) come the page's ids and their number, counted by a window before
    # LIMIT; the page's rows are read last, by id.
    matches = sa.select(*sort_columns(order)).where(condition).limit(cap)
    hits = matches.cte("hits").prefix_with("MATERIALIZED")
    page = (
        sa.select(hits.c.id, sa.func.count().over().label("total"))
        .order_by(*order_by(order, hits.c))
        .limit(limit)
        .offset(offset)
        .subquery("page")
    )
    rows = conn.execute(
        sa.select(
            *_SUMMARY_COLUMNS, fm.conversation_id, fm.headers_json, fm.body_size, page.c.total
        )
        .join_from(failed_messages, page, fm.id == page.c.id)
        .order_by(*order_by(order))
    ).all()
    if rows:
        total = int(rows[0].total)
    else:  # past the last page, or no match: the window had no row to ride on
        matching = sa.select(sa.literal(1)).select_from(failed_messages).where(condition)
        total = _count(conn, matching.limit(cap))
    return SearchPage(total=total, items=[_hit(row) for row in rows])


def search_condition(
    dialect: sa.Dialect, text: str, *, among: sa.Select[Any] | None = None
) -> sa.ColumnElement[bool]:
    """The WHERE condition of ``search_failed_messages`` on ``dialect``'s provider;
    ``among`` as ``Provider.search_matches`` takes it.

    The exact-id alternatives use the primary key and the message-id index, so a message
    is found by its id even where its headers are longer than the indexed prefix.
    """
    stripped = text.strip().replace("\x00", "")
    terms = query_search_terms(text)
    alternatives = [provider_for(dialect).search_matches(terms, among=among)]
    if stripped:
        alternatives.append(fm.message_id == stripped)
        unique_id = _as_uuid(stripped)
        if unique_id is not None:
            alternatives.append(fm.id == unique_id)
    return sa.or_(*alternatives)


# --- pending retries ----------------------------------------------------------------------
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


# --- one message --------------------------------------------------------------------------
def get_failed_message(conn: sa.Connection, failed_message_id: str) -> FailedMessageDetails | None:
    """The failed message ``failed_message_id`` (lower-case "D" UUID), ``None`` if absent."""
    row = conn.execute(
        sa.select(
            *_SUMMARY_COLUMNS,
            fm.headers_json,
            fm.first_failure_at,
            fm.conversation_id,
            fm.content_type,
            fm.body_size,
        ).where(fm.id == failed_message_id)
    ).one_or_none()
    if row is None:
        return None
    return FailedMessageDetails(
        summary=_summary(row),
        headers_json=row.headers_json,
        first_failure_at=row.first_failure_at,
        conversation_id=row.conversation_id,
        content_type=row.content_type,
        body_size=row.body_size,
        groups=_groups(conn, failed_message_id),
    )


def get_last_failed_message(
    conn: sa.Connection, failed_message_id: str
) -> LastFailedMessage | None:
    """``failed_message_id``'s summary and ``ServiceControl.EditOf`` of its stored attempt
    (source: ServiceControl ``GetLatestFailedMessageView``); ``None`` if absent."""
    row = conn.execute(
        sa.select(*_SUMMARY_COLUMNS, fm.headers_json).where(fm.id == failed_message_id)
    ).one_or_none()
    if row is None:
        return None
    edit_of = json.loads(row.headers_json).get(EDIT_OF_HEADER)
    return LastFailedMessage(
        summary=_summary(row), edit_of=edit_of if isinstance(edit_of, str) else None
    )


def get_stored_body(conn: sa.Connection, failed_message_id: str) -> StoredBody | None:
    """Where the body of ``failed_message_id`` is kept, ``None`` if there is no such message."""
    return _stored_body(conn, fm.id == failed_message_id)


def find_stored_body(conn: sa.Connection, message_id: str) -> StoredBody | None:
    """The body of the failed message whose id (UniqueMessageId) is ``message_id``, else of
    the latest failure whose native ``NServiceBus.MessageId`` is ``message_id`` (one
    message id can fail in several endpoints); ``None`` when neither exists.

    ServiceControl's ``messages/{id}/body`` takes either id.
    """
    unique_id = _as_uuid(message_id)
    if unique_id is not None:
        found = _stored_body(conn, fm.id == unique_id)
        if found is not None:
            return found
    return _stored_body(conn, fm.message_id == message_id)


def _stored_body(conn: sa.Connection, condition: sa.ColumnElement[bool]) -> StoredBody | None:
    row = conn.execute(
        sa.select(
            fm.content_type,
            fm.body_size,
            fm.body_text,
            fm.body_stored_externally,
            fm.body_key,
            fm.headers_json,
        )
        .where(condition)
        .order_by(fm.last_failure_at.desc(), fm.id)
        .limit(1)
    ).one_or_none()
    if row is None:
        return None
    return StoredBody(
        content_type=row.content_type,
        size=row.body_size,
        text=row.body_text,
        stored_externally=row.body_stored_externally,
        key=row.body_key,
        content_encoding=content_encoding(json.loads(row.headers_json)),
    )


# --- helpers ------------------------------------------------------------------------------
def _check_window(offset: int, limit: int) -> None:
    if offset < 0 or limit < 1:
        raise ValueError(f"offset must be >= 0 and limit >= 1, got {offset} and {limit}")


def _as_uuid(text: str) -> str | None:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


def _groups(conn: sa.Connection, failed_message_id: str) -> tuple[FailureGroup, ...]:
    groups = failed_message_groups.c
    rows = conn.execute(
        sa.select(groups.group_id, groups.classifier, groups.title)
        .where(groups.failed_message_id == failed_message_id)
        .order_by(groups.classifier, groups.title)
    ).all()
    return tuple(
        FailureGroup(id=row.group_id, classifier=row.classifier, title=row.title) for row in rows
    )


def _hit(row: sa.Row[Any]) -> SearchHit:
    return SearchHit(
        summary=_summary(row),
        conversation_id=row.conversation_id,
        headers_json=row.headers_json,
        body_size=row.body_size,
    )


def _summary(row: sa.Row[Any]) -> FailedMessageSummary:
    values = {column.name: row._mapping[column.name] for column in _SUMMARY_COLUMNS}
    values["status"] = FailedMessageStatus(values["status"])
    return FailedMessageSummary(**values)
