"""What became of a completed retry: how many of the messages it sent have failed again.

Source: docs/decisions.md "A retry's outcome counts the failures since". A retry
operation completes when the broker took every message it sent; whether the endpoints
processed them is known only later, when a message fails again (it comes back to the
error queue, and its retry claim is released then, so the claim cannot tell). A message
*has failed again since* a retry when it is Unresolved, became so after the retry
started, and has failed more than once: read from the messages the operation selected
(its group, queue, endpoint, the one message, or every message). A selection of ids is
not kept, so its count is unknown (``None``).

The event log item of a completion (``RetryOperationCompleted``) says what was sent;
``with_failures_since`` adds, where it is known and not 0, "; N failed again since and are
unresolved" as the API and the console read the log.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import sqlalchemy as sa

from controlroom.db.tables import FailedMessageStatus, failed_message_groups, failed_messages
from controlroom.errors.read.filters import failed_in_queue
from controlroom.errors.retries.requests import RetryOperation, RetryType, get_operation
from controlroom.events import EventLogItem

fm = failed_messages.c
fmg = failed_message_groups.c
COMPLETED_EVENT = "RetryOperationCompleted"
UNRESOLVED = int(FailedMessageStatus.UNRESOLVED)


def failed_again_since(conn: sa.Connection, operation: RetryOperation) -> int | None:
    """Messages the retry ``operation`` selected that have failed again since it started
    (see the module doc); ``None`` for a selection of ids (not kept)."""
    selected = _selected(operation)
    if selected is None:
        return None
    return _count(conn, selected, operation.started_at)


def failed_again_in_group(conn: sa.Connection, group_id: str, since: datetime) -> int:
    """Messages of group ``group_id`` that have failed again since ``since`` (UTC), the
    start of the group's retry."""
    return _count(conn, _in_group(group_id), since)


def _count(conn: sa.Connection, selected: sa.ColumnElement[bool], since: datetime) -> int:
    count = sa.select(sa.func.count()).where(
        selected,
        fm.status == UNRESOLVED,
        # last_modified is stamped with every change, so it bounds status_changed_at from
        # above: the index on (status, last_modified) narrows the count to recent rows.
        fm.last_modified >= since,
        fm.status_changed_at >= since,
        fm.number_of_processing_attempts > 1,
    )
    return int(conn.execute(count).scalar_one())


def _in_group(group_id: str) -> sa.ColumnElement[bool]:
    members = sa.select(fmg.failed_message_id).where(
        fmg.group_id == group_id, fmg.status == UNRESOLVED
    )
    return fm.id.in_(members)


def with_failures_since(conn: sa.Connection, items: list[EventLogItem]) -> list[EventLogItem]:
    """``items`` with each completed retry's description followed by
    "; N failed again since and are unresolved" (``failed_again_text``) when N is known
    and not 0 (one count per such item)."""
    return [_with_failures(conn, item) for item in items]


def _with_failures(conn: sa.Connection, item: EventLogItem) -> EventLogItem:
    if item.event_type != COMPLETED_EVENT:
        return item
    operation_id = next(
        (path.removeprefix("/retry/") for path in item.related_to if path.startswith("/retry/")),
        None,
    )
    operation = get_operation(conn, operation_id) if operation_id else None
    failed = failed_again_since(conn, operation) if operation is not None else None
    if not failed:
        return item
    return replace(item, description=f"{item.description}; {failed_again_text(failed)}")


def failed_again_text(failed: int) -> str:
    """ "N failed again since and are unresolved": a count of now, which archiving or
    resolving one of them lowers (the module doc's rule), not a history."""
    return f"{failed} failed again since and {'is' if failed == 1 else 'are'} unresolved"


def _selected(operation: RetryOperation) -> sa.ColumnElement[bool] | None:
    target = operation.target
    if operation.retry_type is RetryType.ALL:
        return sa.true()
    if target is None:
        return None
    if operation.retry_type is RetryType.FAILURE_GROUP:
        return _in_group(target)
    if operation.retry_type is RetryType.SINGLE_MESSAGE:
        return fm.id == target
    if operation.retry_type is RetryType.BY_QUEUE_ADDRESS:
        return failed_in_queue(target)
    if operation.retry_type is RetryType.ALL_FOR_ENDPOINT:
        return fm.receiving_endpoint == target
    return None
