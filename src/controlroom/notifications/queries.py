"""Reads of the outbox for the API and the console: a keyset-paged list, one
notification, and the KPIs (docs/design.md "Notification outbox").

The list is newest created first, by ``(created_at_utc, notification_id)``, along the
indexes of migration 0023 (overall and per status). The KPIs have the site calls' shape:
``buffered`` (Pending or Retrying), ``parked``, ``failed_last_interval`` and
``delivered_last_interval`` (by ``terminal_at_utc`` within ``interval``),
``oldest_pending_age_seconds`` and ``stuck`` (buffered and created longer ago than
``stuck_threshold``), globally and per channel.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from controlroom.db.filters import filter_conditions
from controlroom.db.tables import notifications
from controlroom.exceptions import ControlroomError
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


class BadCursor(ControlroomError):
    """A paging cursor this service did not hand out."""


@dataclass(frozen=True, slots=True)
class Page:
    """Rows of one page, and the cursor of the next (``None`` on the last page)."""

    rows: Sequence[sa.Row[*tuple[Any, ...]]]
    next_cursor: str | None


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


def encode_cursor(instant: datetime, key: str) -> str:
    text = json.dumps([instant.isoformat(), key])
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The ``(instant, key)`` in ``cursor``. Raises ``BadCursor``."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        instant, key = json.loads(base64.urlsafe_b64decode(padded.encode()))
        parsed = datetime.fromisoformat(instant)
        if parsed.tzinfo is None or not isinstance(key, str):
            raise ValueError
        return parsed.astimezone(UTC), key
    except (ValueError, TypeError, UnicodeDecodeError, binascii.Error):
        raise BadCursor("the cursor is not one this service handed out") from None


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
    if after is not None:
        at, last = decode_cursor(after)
        where.append(
            sa.tuple_(nc.created_at_utc, nc.notification_id)
            < sa.tuple_(sa.literal(at, nc.created_at_utc.type), sa.literal(last))
        )
    rows = conn.execute(
        sa.select(*LISTED)
        .where(*where)
        .order_by(nc.created_at_utc.desc(), nc.notification_id.desc())
        .limit(limit + 1)
    ).all()
    cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        cursor = encode_cursor(rows[-1].created_at_utc, rows[-1].notification_id)
    return Page(rows, cursor)


def get_notification(conn: sa.Connection, notification_id: str) -> sa.Row[*tuple[Any, ...]] | None:
    """One notification (``LISTED``, its ``body`` and ``recipients``), or ``None``."""
    return conn.execute(
        sa.select(*LISTED, nc.body, nc.recipients).where(nc.notification_id == notification_id)
    ).one_or_none()


@dataclass(frozen=True, slots=True)
class Kpis:
    """The KPIs of one scope (module docstring); ages in seconds."""

    buffered: int = 0
    parked: int = 0
    failed_last_interval: int = 0
    delivered_last_interval: int = 0
    oldest_pending_age_seconds: float | None = None
    stuck: int = 0


def measure_kpis(
    conn: sa.Connection, *, now: datetime, interval: timedelta, stuck_threshold: timedelta
) -> dict[str, Kpis]:
    """The KPIs globally (key ``""``) and per channel (its name); two grouped reads."""
    due = [status.value for status in DUE]
    live = conn.execute(
        sa.select(
            nc.channel,
            sa.func.count().filter(nc.status.in_(due)).label("buffered"),
            sa.func.count().filter(nc.status == Status.PARKED.value).label("parked"),
            sa.func.min(sa.case((nc.status.in_(due), nc.created_at_utc))).label("oldest"),
            sa.func.count()
            .filter(nc.status.in_(due), nc.created_at_utc < now - stuck_threshold)
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
    counts: dict[str, dict[str, Any]] = {channel.value: {} for channel in Channel}
    for row in live:
        oldest = row.oldest
        if isinstance(oldest, str):  # SQLite's min() of a text column answers the text
            oldest = datetime.fromisoformat(oldest).replace(tzinfo=UTC)
        age = None if oldest is None else max(0.0, (now - oldest).total_seconds())
        counts.setdefault(row.channel, {}).update(
            buffered=row.buffered,
            parked=row.parked,
            stuck=row.stuck,
            oldest_pending_age_seconds=age,
        )
    for row in ended:
        field = {"Delivered": "delivered_last_interval", "Failed": "failed_last_interval"}.get(
            row.status
        )
        if field is not None:
            counts.setdefault(row.channel, {})[field] = row.n
    scopes = {channel: Kpis(**values) for channel, values in counts.items()}
    ages = [k.oldest_pending_age_seconds for k in scopes.values()]
    known = [age for age in ages if age is not None]
    scopes[""] = Kpis(
        buffered=sum(k.buffered for k in scopes.values()),
        parked=sum(k.parked for k in scopes.values()),
        failed_last_interval=sum(k.failed_last_interval for k in scopes.values()),
        delivered_last_interval=sum(k.delivered_last_interval for k in scopes.values()),
        oldest_pending_age_seconds=max(known) if known else None,
        stuck=sum(k.stuck for k in scopes.values()),
    )
    return scopes
