"""How many failed messages match: exact counts, the database's estimates past a limit,
and the counts by status and endpoint read from the tallies the database keeps.

SQLAlchemy Core only, every value a bound parameter; every function takes an open
``Connection`` so a caller can read a page and its total in one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_error_imports,
    failed_message_group_counts,
    failed_messages,
)
from controlroom.errors import tallies
from controlroom.errors.read.filters import (
    EVERY_MESSAGE,
    FailedMessageFilter,
    filter_conditions,
    status_and_group_only,
    status_conditions,
    subset_conditions,
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


def kept_count(conn: sa.Connection, where: FailedMessageFilter) -> int | None:
    """How many failed messages match ``where`` where the database keeps that count (a
    group's counts, the tallies: ``count_matching``), exactly and without reading the
    messages; ``None`` for a filter it keeps no count of."""
    counted = _group_count(conn, where)
    return counted if counted is not None else _tallied_count(conn, where)


def count_failed_messages(conn: sa.Connection, where: FailedMessageFilter = EVERY_MESSAGE) -> int:
    """How many failed messages match ``where``, exactly: from a group's
    counts when ``where`` filters by a group and statuses only, from the tallies
    (``errors.tallies``) when ``where`` filters by nothing they do not hold (statuses,
    system messages, receiving endpoint), else by counting the matching rows."""
    counted = kept_count(conn, where)
    return counted if counted is not None else count_rows(conn, _matching_rows(conn, where))


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
        found = status_conditions(c.status, where)
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
    counted = kept_count(conn, where)
    if counted is not None:
        return Total(counted)
    return _count_or_estimate(conn, _matching_rows(conn, where), exact_count_limit)


def _group_count(conn: sa.Connection, where: FailedMessageFilter) -> int | None:
    """The exact number of a group's messages when ``where`` filters by nothing but a
    group and statuses: the sum of the group's counts per status, kept by the database
    (``failed_message_group_counts``); ``None`` for any other filter."""
    if where.group_id is None or not status_and_group_only(where):
        return None
    counts = failed_message_group_counts.c
    total = sa.select(sa.func.coalesce(sa.func.sum(counts.n), 0)).where(
        counts.group_id == where.group_id, *status_conditions(counts.status, where)
    )
    return int(conn.execute(total).scalar_one())


def _count_or_estimate(
    conn: sa.Connection, rows: sa.Select[Any], exact_count_limit: int | None
) -> Total:
    if exact_count_limit is None:
        return Total(count_rows(conn, rows))
    counted = count_rows(conn, rows.limit(exact_count_limit + 1))
    if counted <= exact_count_limit:
        return Total(counted)
    estimate = provider_for(conn).estimate_rows(conn, rows)
    if estimate is None:
        return Total(count_rows(conn, rows))
    return Total(max(estimate, exact_count_limit + 1), estimated=True)


def count_rows(conn: sa.Connection, rows: sa.Select[Any]) -> int:
    """How many rows ``rows`` returns, counted by the database."""
    query = sa.select(sa.func.count()).select_from(rows.subquery("matching"))
    return int(conn.execute(query).scalar_one())


def _matching_rows(conn: sa.Connection, where: FailedMessageFilter) -> sa.Select[Any]:
    """One row for each failed message matching ``where``, to be counted; read from the
    subset's rows when ``where`` names an endpoint or a queue address
    (``subset_conditions``), as its page is."""
    if where.receiving_endpoint is not None or where.queue_address is not None:
        conditions = subset_conditions(where, provider_for(conn))
    else:
        conditions = filter_conditions(where)
    return sa.select(sa.literal(1)).select_from(failed_messages).where(*conditions)


def count_by_status(conn: sa.Connection) -> dict[FailedMessageStatus, int]:
    """How many failed messages there are in each status (every status present, maybe 0).

    Read from the tallies the database keeps (``errors.tallies``, migration 0012): equal
    to counting the messages, at the cost of a few thousand rows (docs/decisions.md "The
    database keeps the counts")."""
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
    rows = unresolved_tally_rows().subquery("unresolved")
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
    rows = unresolved_tally_rows().subquery("unresolved")
    failures = sa.func.sum(rows.c.messages).label("failures")
    found = conn.execute(
        sa.select(rows.c.receiving_endpoint, rows.c.receiving_host_id, failures)
        .group_by(rows.c.receiving_endpoint, rows.c.receiving_host_id)
        .having(failures > 0)
    ).all()
    return {(row.receiving_endpoint, row.receiving_host_id): int(row.failures) for row in found}


def unresolved_tally_rows() -> sa.CompoundSelect[Any]:
    """The tally rows (``errors.tallies.tally_rows``) of Unresolved failed messages."""
    return tallies.tally_rows(lambda c: [c.status == int(FailedMessageStatus.UNRESOLVED)])


def count_failed_imports(conn: sa.Connection) -> int:
    """How many messages are kept as failed imports (waiting to be re-imported)."""
    query = sa.select(sa.func.count()).select_from(failed_error_imports)
    return int(conn.execute(query).scalar_one())
