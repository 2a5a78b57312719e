"""The error instance's entries in the event log (``controlroom.events``), one function per
kind of event, each written on the caller's connection inside the transaction that did
what it describes (docs/design.md "Event log").

``by`` is the name of the caller's token (``anonymous`` on an open API). Counts are
messages. Descriptions quote no message content, only ids and counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa

from controlroom.event_types import EventType
from controlroom.events import (
    Category,
    Severity,
    endpoint_path,
    group_path,
    message_path,
    record_event,
)

RELATED_LIMIT = 50
"""Ids listed in ``related_to`` at most; the description carries the full count."""


def _messages(ids: Sequence[str]) -> list[str]:
    return [message_path(i) for i in list(ids)[:RELATED_LIMIT]]


def messages_archived(
    conn: sa.Connection, ids: Sequence[str], *, by: str, now: datetime, archived: bool
) -> None:
    """``archived``: Unresolved -> Archived, else Archived -> Unresolved, by id."""
    if not ids:
        return
    verb = "archived" if archived else "unarchived"
    _operator_did(
        conn,
        f"{_count(len(ids), 'failed message')} {verb}",
        by,
        category=Category.MESSAGE_FAILURES,
        event_type=EventType.FAILED_MESSAGES_ARCHIVED
        if archived
        else EventType.FAILED_MESSAGES_UNARCHIVED,
        related_to=_messages(ids),
        now=now,
    )


def group_archived(
    conn: sa.Connection, group_id: str, count: int, *, by: str, now: datetime, archived: bool
) -> None:
    """A whole group archived or unarchived (``count`` messages changed)."""
    verb = "archived" if archived else "unarchived"
    _operator_did(
        conn,
        f"{_count(count, 'failed message')} of group {group_id} {verb}",
        by,
        category=Category.RECOVERABILITY,
        event_type=EventType.FAILED_MESSAGE_GROUP_ARCHIVED
        if archived
        else EventType.FAILED_MESSAGE_GROUP_UNARCHIVED,
        related_to=[group_path(group_id)],
        now=now,
    )


def group_comment_changed(
    conn: sa.Connection, group_id: str, *, by: str, now: datetime, deleted: bool
) -> None:
    what = "deleted" if deleted else "set"
    _operator_did(
        conn,
        f"comment of group {group_id} {what}",
        by,
        category=Category.RECOVERABILITY,
        event_type=EventType.GROUP_COMMENT_DELETED if deleted else EventType.GROUP_COMMENT_CHANGED,
        related_to=[group_path(group_id)],
        now=now,
    )


def retry_requested(
    conn: sa.Connection,
    operation_id: str,
    retry_type: str,
    target: str | None,
    count: int,
    *,
    by: str | None,
    now: datetime,
    ended: bool = False,
) -> None:
    """A retry operation was requested (``now``: when), of ``count`` messages; ``ended``:
    its request ended before it made all its batches, and ``count`` is what it made."""
    aim = f" of {target}" if target else ""
    who = f" by {by}" if by else ""
    cut = "; its request ended before it claimed every message" if ended else ""
    record_event(
        conn,
        description=(
            f"retry ({retry_type}{aim}) of {_count(count, 'message')} requested{who}{cut}"
        ),
        severity=Severity.INFO,
        category=Category.RECOVERABILITY,
        event_type=EventType.RETRY_OPERATION_REQUESTED,
        raised_at=now,
        related_to=[f"/retry/{operation_id}"],
    )


def retry_finished(
    conn: sa.Connection,
    operation_id: str,
    *,
    message_count: int,
    forwarded: int,
    skipped: int,
    failed: bool,
    now: datetime,
) -> None:
    """A retry operation completed: what it sent (the broker took them), skipped and could
    not send. Sent is not processed: whether a message failed again is known later, and
    read with the log (``retries.outcomes.with_failures_since``), so the description never
    claims success."""
    parts = [f"{forwarded} sent"]
    if skipped:
        parts.append(f"{skipped} skipped")
    unsent = message_count - forwarded - skipped
    if unsent > 0:
        parts.append(f"{unsent} could not be sent")
    record_event(
        conn,
        description=f"retry operation {operation_id} finished: {', '.join(parts)}",
        severity=Severity.WARNING if failed else Severity.INFO,
        category=Category.RECOVERABILITY,
        event_type=EventType.RETRY_OPERATION_COMPLETED,
        raised_at=now,
        related_to=[f"/retry/{operation_id}"],
    )


def retry_refused(
    conn: sa.Connection,
    operation_id: str,
    batch_id: str,
    ids: Sequence[str],
    summaries: Sequence[str],
    *,
    now: datetime,
) -> None:
    """Messages of a retry that cannot be sent for a reason of their own (a body that was
    not kept, unreadable stored headers, no queue): ``summaries`` say what, quoting
    nothing of the messages; the operation's ``failure_reason`` has the details."""
    record_event(
        conn,
        description=(
            f"retry batch {batch_id}: {_count(len(ids), 'message')} cannot be sent "
            f"({'; '.join(summaries)}) and {'is' if len(ids) == 1 else 'are'} Unresolved again"
        ),
        severity=Severity.WARNING,
        category=Category.RECOVERABILITY,
        event_type=EventType.RETRY_MESSAGES_UNSENDABLE,
        raised_at=now,
        related_to=[f"/retry/{operation_id}", *_messages(ids)],
    )


def retry_given_up(
    conn: sa.Connection,
    operation_id: str,
    batch_id: str,
    ids: Sequence[str],
    reason: str,
    *,
    attempts: int,
    now: datetime,
) -> None:
    record_event(
        conn,
        description=(
            f"retry batch {batch_id} gave up on {len(ids)} messages after {attempts} failed "
            f"sends; they are Unresolved again: {reason}"
        ),
        severity=Severity.ERROR,
        category=Category.RECOVERABILITY,
        event_type=EventType.RETRY_BATCH_GIVEN_UP,
        raised_at=now,
        related_to=[f"/retry/{operation_id}", *_messages(ids)],
    )


def failed_imports_kept(
    conn: sa.Connection, items: Sequence[tuple[str, str]], *, queue: str, now: datetime
) -> None:
    """``items``: ``(failed import id, reason)`` pairs, one event each."""
    for import_id, reason in items:
        record_event(
            conn,
            description=f"a message of {queue} was kept as failed import {import_id}: {reason}",
            severity=Severity.ERROR,
            category=Category.FAILED_IMPORTS,
            event_type=EventType.MESSAGE_FAILED_TO_IMPORT,
            raised_at=now,
            related_to=[f"/failedimport/{import_id}"],
        )


def failed_imports_reimported(
    conn: sa.Connection, ids: Sequence[str], *, queue: str, by: str, now: datetime
) -> None:
    if not ids:
        return
    _operator_did(
        conn,
        f"{_count(len(ids), 'failed import')} put back on {queue}",
        by,
        category=Category.FAILED_IMPORTS,
        event_type=EventType.FAILED_IMPORTS_REIMPORTED,
        related_to=[f"/failedimport/{i}" for i in list(ids)[:RELATED_LIMIT]],
        now=now,
    )


def retention_swept(
    conn: sa.Connection, deleted: int, *, cutoff: datetime, events_purged: int, now: datetime
) -> None:
    record_event(
        conn,
        description=(
            f"retention deleted {deleted} Resolved or Archived failed messages last changed "
            f"before {cutoff.isoformat()} and {events_purged} old event log items"
        ),
        severity=Severity.INFO,
        category=Category.RETENTION,
        event_type=EventType.RETENTION_SWEEP_COMPLETED,
        raised_at=now,
    )


def endpoint_monitoring_changed(
    conn: sa.Connection, endpoint_id: str, monitored: bool, *, by: str, now: datetime
) -> None:
    state = "enabled" if monitored else "disabled"
    _operator_did(
        conn,
        f"monitoring of endpoint {endpoint_id} {state}",
        by,
        category=Category.ENDPOINTS,
        event_type=EventType.MONITORING_ENABLED_FOR_ENDPOINT
        if monitored
        else EventType.MONITORING_DISABLED_FOR_ENDPOINT,
        related_to=[endpoint_path(endpoint_id)],
        now=now,
    )


def failure_group_appeared(
    conn: sa.Connection, group_id: str, title: str, *, endpoint: str, messages: int, now: datetime
) -> None:
    """A failure group got its first messages (``messages`` of them in this batch; its
    first one failed in ``endpoint``)."""
    record_event(
        conn,
        description=f"a new failure group appeared with {_count(messages, 'message')}: {title}",
        severity=Severity.WARNING,
        category=Category.MESSAGE_FAILURES,
        event_type=EventType.FAILURE_GROUP_APPEARED,
        raised_at=now,
        related_to=[group_path(group_id), endpoint_path(endpoint)],
    )


def group_failures_passed(
    conn: sa.Connection, group_id: str, title: str, *, failures: int, hour: int, now: datetime
) -> None:
    """A group's failures within one clock hour (``hour``: whole hours since 1970 UTC)
    reached ``ingestion.alert_group_failures_per_hour``."""
    _hour_passed(
        conn,
        f"{failures} failures",
        hour,
        f"group {title}",
        event_type=EventType.GROUP_FAILURES_PASSED_THRESHOLD,
        related_to=group_path(group_id),
        now=now,
    )


def endpoint_failures_passed(
    conn: sa.Connection, endpoint: str, *, failures: int, hour: int, now: datetime
) -> None:
    """An endpoint's unresolved failures within one clock hour (``hour``: whole hours
    since 1970 UTC) reached ``ingestion.alert_endpoint_failures_per_hour``."""
    _hour_passed(
        conn,
        f"{failures} unresolved failures",
        hour,
        f"endpoint {endpoint}",
        event_type=EventType.ENDPOINT_FAILURES_PASSED_THRESHOLD,
        related_to=endpoint_path(endpoint),
        now=now,
    )


def _operator_did(
    conn: sa.Connection,
    what: str,
    by: str,
    *,
    category: Category,
    event_type: EventType,
    related_to: list[str],
    now: datetime,
) -> None:
    """An operator's action, described ``<what> by <by>`` (Info)."""
    record_event(
        conn,
        description=f"{what} by {by}",
        severity=Severity.INFO,
        category=category,
        event_type=event_type,
        raised_at=now,
        related_to=related_to,
    )


def _hour_passed(
    conn: sa.Connection,
    failures: str,
    hour: int,
    of: str,
    *,
    event_type: EventType,
    related_to: str,
    now: datetime,
) -> None:
    """A threshold of failures within one clock hour reached (``hour``: whole hours since
    1970 UTC), described ``<failures> in the hour from <its start> of <of>`` (Error)."""
    started = datetime.fromtimestamp(hour * 3600, UTC).isoformat()
    record_event(
        conn,
        description=f"{failures} in the hour from {started} of {of}",
        severity=Severity.ERROR,
        category=Category.MESSAGE_FAILURES,
        event_type=event_type,
        raised_at=now,
        related_to=[related_to],
    )


def _count(n: int, noun: str) -> str:
    """``1 message``, ``2 messages``: event descriptions read as sentences."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
