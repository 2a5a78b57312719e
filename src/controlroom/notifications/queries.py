"""Reads of the outbox for the API and the console: a keyset-paged list, one
notification, and the KPIs (docs/design.md "Notification outbox").

The list is newest created first, by ``(created_at_utc, notification_id)``, along the
indexes of migration 0023 (overall and per status). The KPIs have the site calls' shape:
``buffered`` (Pending or Retrying), ``parked``, ``failed_last_interval`` and
``delivered_last_interval`` (by ``terminal_at_utc`` within ``interval``),
``oldest_pending_age_seconds`` and ``stuck`` (buffered and due for longer than
``stuck_threshold``), globally and per channel. Both measure from when a notification
became due (``due_since``), never from its creation: a rule's notification waits for
its coalescing window to end, and is not late before then.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from controlroom.db.filters import filter_conditions
from controlroom.db.keyset import BadCursor as BadCursor
from controlroom.db.keyset import Page as Page
from controlroom.db.keyset import keyset_page
from controlroom.db.kpi_history import KpiFigures
from controlroom.db.tables import notifications
from controlroom.notifications.lifecycle import DUE, Channel, Status

nc = notifications.c

LISTED = (
    nc.notification_id,
    nc.source,
    nc.channel,
    nc.target,
    nc.subject,
    nc.severity,
    nc.status,
    nc.retry_count,
    nc.last_error,
    nc.reply_code,
    nc.created_at_utc,
    nc.updated_at_utc,
    nc.next_attempt_at_utc,
    nc.terminal_at_utc,
    nc.source_event_id,
)
"""What a list row and the API show (never the payload, nor the claim)."""


@dataclass(frozen=True, slots=True)
class NotificationFilter:
    """Filters of the list; ``None`` means any."""

    status: str | None = None
    channel: str | None = None
    source: str | None = None
    target: str | None = None
    created_from: datetime | None = None
    """Created at or after this instant."""
    created_to: datetime | None = None
    """Created before this instant."""


def list_notifications(
    conn: sa.Connection, filters: NotificationFilter, *, limit: int, after: str | None
) -> Page:
    """Notifications newest created first, ``limit`` per page. Raises ``BadCursor``."""
    where = filter_conditions(
        (
            (nc.status, filters.status),
            (nc.channel, filters.channel),
            (nc.source, filters.source),
            (nc.target, filters.target),
        ),
        nc.created_at_utc,
        filters.created_from,
        filters.created_to,
    )
    return keyset_page(
        conn,
        sa.select(*LISTED),
        (nc.created_at_utc, nc.notification_id),
        where,
        limit=limit,
        after=after,
    )


def get_notification(conn: sa.Connection, notification_id: str) -> sa.Row[*tuple[Any, ...]] | None:
    """One notification (``LISTED``, its ``body``, ``recipients``, ``delivered_to``, both
    JSON lists or ``None``, and ``event_count``), or ``None``."""
    return conn.execute(
        sa.select(*LISTED, nc.body, nc.recipients, nc.delivered_to, nc.event_count).where(
            nc.notification_id == notification_id
        )
    ).one_or_none()


def due_since() -> sa.ColumnElement[Any]:
    """When a buffered notification became due: before its first attempt, its
    ``next_attempt_at_utc`` (a site's: its creation; a rule's: its window's end; after an
    operator's Retry: the Retry; while a claim holds it: the claim's end, so one being
    sent is not late); once attempted, its creation (the first due time is not kept: a
    rule's notification then counts from up to a window or two before it was due)."""
    return sa.case((nc.retry_count == 0, nc.next_attempt_at_utc), else_=nc.created_at_utc)


def measure_kpis(
    conn: sa.Connection, *, now: datetime, interval: timedelta, stuck_threshold: timedelta
) -> dict[str, dict[str, float | int | None]]:
    """The KPIs at ``now`` by metric name (``db.kpi_history.METRICS``), globally (key
    ``""``: the channels' sum, the oldest of their pending) and per channel (its name);
    two grouped reads. The oldest pending and stuck count the buffered notifications
    due at ``now`` (``due_since``), from when each became due."""
    due = [status.value for status in DUE]
    since = due_since()
    live = conn.execute(
        sa.select(
            nc.channel,
            sa.func.count().filter(nc.status.in_(due)).label("buffered"),
            sa.func.count().filter(nc.status == Status.PARKED.value).label("parked"),
            sa.func.min(sa.case((sa.and_(nc.status.in_(due), since <= now), since))).label(
                "oldest"
            ),
            sa.func.count()
            .filter(nc.status.in_(due), since < now - stuck_threshold)
            .label("stuck"),
        )
        .where(nc.status.in_([*due, Status.PARKED.value]))
        .group_by(nc.channel)
    ).all()
    ended = conn.execute(
        sa.select(nc.channel, nc.status, sa.func.count().label("n"))
        .where(nc.terminal_at_utc >= now - interval)
        .group_by(nc.channel, nc.status)
    ).all()
    channels = {channel.value: KpiFigures() for channel in Channel}
    for row in live:
        oldest = row.oldest
        if isinstance(oldest, str):  # SQLite's min() of a text column answers the text
            oldest = datetime.fromisoformat(oldest).replace(tzinfo=UTC)
        figures = channels.setdefault(row.channel, KpiFigures())
        figures.buffered, figures.parked, figures.stuck = row.buffered, row.parked, row.stuck
        figures.oldest_pending_created = oldest
    for row in ended:
        figures = channels.setdefault(row.channel, KpiFigures())
        if row.status == Status.DELIVERED.value:
            figures.delivered_last_interval = row.n
        elif row.status == Status.FAILED.value:
            figures.failed_last_interval = row.n
    total = KpiFigures()
    for figures in channels.values():
        total.add(figures)
    return {"": total.as_dict(now)} | {
        channel: figures.as_dict(now) for channel, figures in channels.items()
    }
