"""The read side of the error instance: failed messages as the API and console show them.

SQLAlchemy Core only, every value a bound parameter. Every function takes an open
``Connection`` so a caller can read a page and its total in one transaction. Times are
timezone-aware UTC; sizes are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from controlroom.db.tables import FailedMessageStatus, failed_message_groups, failed_messages
from controlroom.errors.model import FailureGroup

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
class FailedMessageDetails:
    """One failed message in full: the summary, its headers, failure window and groups."""

    summary: FailedMessageSummary
    headers_json: str  # the stored source of truth, a JSON object
    first_failure_at: datetime
    content_type: str
    body_size: int  # true size in bytes, wherever the body is kept
    groups: tuple[FailureGroup, ...]  # ordered by classifier, then title


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


@dataclass(frozen=True, slots=True)
class FailedMessagePage:
    """One page of failed messages and the total over all pages."""

    total: int
    items: list[FailedMessageSummary]


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


def list_failed_messages(conn: sa.Connection, *, offset: int, limit: int) -> FailedMessagePage:
    """Failed messages, newest time of failure first (ties by id, so pages are stable),
    ``limit`` rows from ``offset``, with the total count.

    Raises ``ValueError`` for a negative ``offset`` or a ``limit`` below 1.
    """
    if offset < 0 or limit < 1:
        raise ValueError(f"offset must be >= 0 and limit >= 1, got {offset} and {limit}")
    total = conn.execute(sa.select(sa.func.count()).select_from(failed_messages)).scalar_one()
    rows = conn.execute(
        sa.select(*_SUMMARY_COLUMNS)
        .order_by(fm.last_failure_at.desc(), fm.id.desc())
        .limit(limit)
        .offset(offset)
    ).all()
    return FailedMessagePage(total=total, items=[_summary(row) for row in rows])


def get_failed_message(conn: sa.Connection, failed_message_id: str) -> FailedMessageDetails | None:
    """The failed message ``failed_message_id`` (lower-case "D" UUID), ``None`` if absent."""
    row = conn.execute(
        sa.select(
            *_SUMMARY_COLUMNS,
            fm.headers_json,
            fm.first_failure_at,
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
        content_type=row.content_type,
        body_size=row.body_size,
        groups=_groups(conn, failed_message_id),
    )


def get_stored_body(conn: sa.Connection, failed_message_id: str) -> StoredBody | None:
    """Where the body of ``failed_message_id`` is kept, ``None`` if there is no such message."""
    row = conn.execute(
        sa.select(
            fm.content_type,
            fm.body_size,
            fm.body_text,
            fm.body_stored_externally,
            fm.body_key,
        ).where(fm.id == failed_message_id)
    ).one_or_none()
    if row is None:
        return None
    return StoredBody(
        content_type=row.content_type,
        size=row.body_size,
        text=row.body_text,
        stored_externally=row.body_stored_externally,
        key=row.body_key,
    )


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


def _summary(row: sa.Row[Any]) -> FailedMessageSummary:
    values = {column.name: row._mapping[column.name] for column in _SUMMARY_COLUMNS}
    values["status"] = FailedMessageStatus(values["status"])
    return FailedMessageSummary(**values)
