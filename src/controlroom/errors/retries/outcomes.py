"""What became of a completed retry: how many of the messages it sent have failed again.

Source: docs/decisions.md "A retry's outcome counts the failures since". A retry
operation completes when the broker took every message it sent; whether the endpoints
processed them is known only later, when a message fails again (it comes back to the
error queue, and its retry claim is released then, so the claim cannot tell). A message
*has failed again since* a retry when it is Unresolved, became so after the retry
started, and has failed more than once: read from the messages the operation claimed,
kept with it (``retry_operation_messages``, written with its claims), whatever group,
queue address or endpoint they are in now. Every kind of retry has a count, a selection
of ids too.

The event log item of a completion (``RetryOperationCompleted``) says what was sent;
``with_failures_since`` adds, where the operation is still kept and the count is not 0,
"; N failed again since and are unresolved" as the API and the console read the log.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import sqlalchemy as sa

from controlroom.db.tables import FailedMessageStatus, failed_messages, retry_operation_messages
from controlroom.errors.retries.requests import RetryOperation, get_operation
from controlroom.events import EventLogItem

fm = failed_messages.c
rom = retry_operation_messages.c
COMPLETED_EVENT = "RetryOperationCompleted"
UNRESOLVED = int(FailedMessageStatus.UNRESOLVED)


def failed_again_since(conn: sa.Connection, operation: RetryOperation) -> int:
    """Messages the retry ``operation`` claimed that have failed again since it started
    (see the module doc)."""
    return count_failed_again(conn, operation.id, operation.started_at)


def count_failed_again(conn: sa.Connection, operation_id: str, since: datetime) -> int:
    """Messages retry operation ``operation_id`` claimed that have failed again since
    ``since`` (UTC), the start of the operation."""
    claimed = sa.exists().where(rom.operation_id == operation_id, rom.failed_message_id == fm.id)
    count = sa.select(sa.func.count()).where(
        fm.status == UNRESOLVED,
        # last_modified is stamped with every change, so it bounds status_changed_at from
        # above: the index on (status, last_modified) narrows the count to recent rows,
        # each then probed in the operation's claimed ids (their primary key).
        fm.last_modified >= since,
        fm.status_changed_at >= since,
        fm.number_of_processing_attempts > 1,
        claimed,
    )
    return int(conn.execute(count).scalar_one())


def with_failures_since(conn: sa.Connection, items: list[EventLogItem]) -> list[EventLogItem]:
    """``items`` with each completed retry's description followed by
    "; N failed again since and are unresolved" (``failed_again_text``) when its
    operation is still kept (the retention sweep purges old ones) and N is not 0 (one
    count per such item)."""
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
