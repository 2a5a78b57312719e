"""Notification rules: event log items become notifications in the transaction that
records them (a transactional outbox: no event without its notification, no
notification without its event), coalesced per window (docs/design.md "Notification
rules").

A rule (``notifications.rules[]``) matches an event by its type and, optionally, its
``related_to`` paths (one path, an endpoint, a failure group, a site) and a least
severity. The events of one rule in one window — the rule's ``window``-long slots
counted from the Unix epoch — make one notification, id derived from the rule and the
window's start (``source_event_id`` ``window:<start>``). The first event enqueues it due
at the window's end; each later one counts itself into it (subject, body and webhook
payload say how many) while it has not been claimed. An event that comes when its
window's notification is already claimed or done goes to the next window's (and so on):
it is never in the event log only. A storm of 10,000 events is one notification saying
10,000. A rendering the store refuses is kept whole with the reason (``keep_rejected``)
and the event commits.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from functools import partial

import sqlalchemy as sa

from controlroom.config import NotificationRule, NotificationSettings
from controlroom.db.tables import notifications
from controlroom.events import (
    EventLogItem,
    at_least,
    endpoint_path,
    group_path,
    site_path,
    subscribe,
)
from controlroom.notifications.lifecycle import Status
from controlroom.notifications.store import (
    NewNotification,
    NotificationRejected,
    enqueue,
    keep_rejected,
    webhook_payload,
)

nc = notifications.c


@contextlib.contextmanager
def rules_applied(engine: sa.Engine, settings: NotificationSettings) -> Iterator[None]:
    """For the block: every event recorded on ``engine`` meets ``settings``' rules in its
    transaction (``apply_rules``). Every process that opens the store for work that
    writes events (serve, its workers, the CLI's commands) runs that work inside one, so
    no event escapes the rules."""
    unsubscribe = subscribe(engine, partial(apply_rules, settings))
    try:
        yield
    finally:
        unsubscribe()


def matches(rule: NotificationRule, event: EventLogItem) -> bool:
    """``event`` is one ``rule`` reacts to."""
    if event.event_type not in rule.event_types or not at_least(event.severity, rule.min_severity):
        return False
    paths = (
        rule.related_to,
        None if rule.endpoint is None else endpoint_path(rule.endpoint),
        None if rule.group is None else group_path(rule.group),
        None if rule.site is None else site_path(rule.site),
    )
    return all(path is None or path in event.related_to for path in paths)


def window_of(rule: NotificationRule, at: datetime) -> tuple[datetime, datetime]:
    """The start and end (UTC) of ``rule``'s window holding ``at``."""
    seconds = rule.window.total_seconds()
    start = math.floor(at.timestamp() / seconds) * seconds
    begins = datetime.fromtimestamp(start, UTC)
    return begins, begins + timedelta(seconds=seconds)


def notification_of(
    rule: NotificationRule, event: EventLogItem, count: int, start: datetime, end: datetime
) -> NewNotification:
    """The notification of ``count`` events of ``rule`` in the window ``start``-``end``,
    ``event`` the latest."""
    kinds = ", ".join(rule.event_types)
    noun = "event" if count == 1 else "events"
    return NewNotification(
        source=f"rule:{rule.name}",
        channel=rule.channel,
        target=rule.target,
        subject=f"{rule.name}: {count:,} {noun}",
        body=(
            f"{count:,} {noun} of rule {rule.name} ({kinds}) between {start.isoformat()} and "
            f"{end.isoformat()}.\nLatest ({event.event_type}, {event.raised_at.isoformat()}): "
            f"{event.description}"
        ),
        severity=rule.severity,
        source_event_id=f"window:{start.isoformat()}",
    )


def apply_rules(settings: NotificationSettings, conn: sa.Connection, event: EventLogItem) -> None:
    """Enqueue or count ``event`` into each matching rule's notification of its window,
    in ``conn``'s transaction (the event's)."""
    for rule in settings.rules:
        if matches(rule, event):
            _count(rule, conn, event)


def _count(rule: NotificationRule, conn: sa.Connection, event: EventLogItem) -> None:
    start, end = window_of(rule, event.raised_at)
    # A claimed window's notification was due, so its window has ended: the windows
    # after it are walked until one is not claimed yet (a future one never is).
    while not _count_into(rule, conn, event, start, end):
        start, end = end, end + rule.window


def _count_into(
    rule: NotificationRule,
    conn: sa.Connection,
    event: EventLogItem,
    start: datetime,
    end: datetime,
) -> bool:
    """Enqueue or count ``event`` into ``rule``'s notification of ``start``-``end``;
    ``False`` when that one is claimed or done already."""
    first = notification_of(rule, event, 1, start, end)
    try:
        stored = enqueue(conn, first, now=event.raised_at, due_at=end, event_count=1)
    except NotificationRejected as exc:
        # Kept, never raised: a rule's fault must not undo the change the event records.
        keep_rejected(conn, first.source, asdict(first), str(exc), now=event.raised_at)
        return True
    if stored.created:
        return True
    unsent = sa.and_(
        nc.notification_id == stored.notification_id,
        nc.status == Status.PENDING.value,
        nc.retry_count == 0,
        nc.claim_token.is_(None),
    )
    # The count first: its row lock holds the row until the commit, so the text written
    # next says the count of this transaction, whatever other writers do.
    counted = conn.execute(
        sa.update(notifications).where(unsent).values(event_count=nc.event_count + 1)
    ).rowcount
    if counted != 1:
        return False
    count = conn.execute(
        sa.select(nc.event_count).where(nc.notification_id == stored.notification_id)
    ).scalar_one()
    latest = notification_of(rule, event, count, start, end)
    conn.execute(
        sa.update(notifications)
        .where(nc.notification_id == stored.notification_id)
        .values(
            subject=latest.subject,
            body=latest.body,
            payload=webhook_payload(stored.notification_id, latest, event.raised_at)
            if rule.channel == "Webhook"
            else None,
            updated_at_utc=event.raised_at,
        )
    )
    return True
