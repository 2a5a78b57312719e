"""One failed message: in full, as ``errors/last/{id}`` shows it, and where its body is.

SQLAlchemy Core only. Times are timezone-aware UTC; sizes are bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from controlroom.db.tables import failed_message_groups, failed_messages
from controlroom.errors.ingest.headers import body_not_kept, content_encoding
from controlroom.errors.model import FailureGroup
from controlroom.errors.read.filters import as_uuid, message_id_is
from controlroom.errors.read.summaries import SUMMARY_COLUMNS, FailedMessageSummary, to_summary

fm = failed_messages.c


EDIT_OF_HEADER = "ServiceControl.EditOf"
"""Header naming the failed message an edited-and-retried message was made from."""


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
class StoredBody:
    """Where a failed message's body is: inline text, or a key in the body store.

    When ``stored_externally`` the body store holds the authoritative copy under ``key``
    and ``text`` is only a searchable prefix (docs/design.md "Body placement").
    """

    content_type: str
    size: int
    text: str | None
    stored_externally: bool
    key: str | None
    content_encoding: str | None = None  # the body's encoding (gzip, ...), None when plain
    not_kept: str | None = None  # why the body was not kept (Controlroom.TaskQueue.BodyNotKept)


def get_failed_message(conn: sa.Connection, failed_message_id: str) -> FailedMessageDetails | None:
    """The failed message ``failed_message_id`` (lower-case "D" UUID), ``None`` if absent."""
    row = conn.execute(
        sa.select(
            *SUMMARY_COLUMNS,
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
        summary=to_summary(row),
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
        sa.select(*SUMMARY_COLUMNS, fm.headers_json).where(fm.id == failed_message_id)
    ).one_or_none()
    if row is None:
        return None
    edit_of = json.loads(row.headers_json).get(EDIT_OF_HEADER)
    return LastFailedMessage(
        summary=to_summary(row), edit_of=edit_of if isinstance(edit_of, str) else None
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
    unique_id = as_uuid(message_id)
    if unique_id is not None:
        found = _stored_body(conn, fm.id == unique_id)
        if found is not None:
            return found
    return _stored_body(conn, message_id_is(message_id))


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
    headers = json.loads(row.headers_json)
    return StoredBody(
        content_type=row.content_type,
        size=row.body_size,
        text=row.body_text,
        stored_externally=row.body_stored_externally,
        key=row.body_key,
        content_encoding=content_encoding(headers),
        not_kept=body_not_kept(headers) if row.body_size == 0 else None,
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
