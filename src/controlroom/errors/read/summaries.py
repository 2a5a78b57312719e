"""A failed message as a list row shows it, and the pages lists and searches return.

SQLAlchemy Core only. Times are timezone-aware UTC; sizes are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from controlroom.db.providers import SearchQuery, provider_for
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.read.counts import Total
from controlroom.errors.read.filters import Ordering, order_by

fm = failed_messages.c


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
class SearchHit:
    """A failed message found by full-text search, with what a message list shows."""

    summary: FailedMessageSummary
    conversation_id: str | None
    headers_json: str  # the stored source of truth, a JSON object
    body_size: int  # bytes


@dataclass(frozen=True, slots=True)
class FailedMessagePage:
    """One page of failed messages and the total over all pages."""

    total: int
    items: list[FailedMessageSummary]
    total_estimated: bool = False
    """``total`` is the database's estimate (``count_matching``), not a count."""
    query: SearchQuery | None = None
    """The terms the full-text index was asked for (a search's page only)."""
    widened: tuple[str, ...] = ()
    """Words of the search's text that matched nothing as written and were looked for as
    prefixes instead (``errors.read.search.search_failed_messages``'s ``widen``)."""


@dataclass(frozen=True, slots=True)
class SearchPage:
    """One page of search hits and the total over all pages."""

    total: int
    items: list[SearchHit]
    total_estimated: bool = False
    """``total`` is the database's estimate (``count_matching``), not a count."""
    query: SearchQuery | None = None
    """The terms the full-text index was asked for (a search's page only)."""
    widened: tuple[str, ...] = ()
    """Words of the search's text that matched nothing as written and were looked for as
    prefixes instead (``errors.read.search.search_failed_messages``'s ``widen``)."""


SUMMARY_COLUMNS = (
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


def hits_page(
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
        sa.select(*SUMMARY_COLUMNS, fm.conversation_id, fm.headers_json, fm.body_size)
        .join_from(failed_messages, page, fm.id == page.c.id)
        .order_by(*order_by(provider_for(conn), order))
    ).all()
    total = total.at_least_seen(offset, len(rows), limit)
    return SearchPage(
        total=total.value, items=[to_hit(row) for row in rows], total_estimated=total.estimated
    )


def to_hit(row: sa.Row[*tuple[Any, ...]]) -> SearchHit:
    """The hit of ``row``, which holds ``SUMMARY_COLUMNS`` and the conversation id,
    headers and body size."""
    return SearchHit(
        summary=to_summary(row),
        conversation_id=row.conversation_id,
        headers_json=row.headers_json,
        body_size=row.body_size,
    )


def to_summary(row: sa.Row[*tuple[Any, ...]]) -> FailedMessageSummary:
    """The summary of ``row``, which holds (at least) ``SUMMARY_COLUMNS``."""
    values = {column.name: row._mapping[column.name] for column in SUMMARY_COLUMNS}
    values["status"] = FailedMessageStatus(values["status"])
    return FailedMessageSummary(**values)
