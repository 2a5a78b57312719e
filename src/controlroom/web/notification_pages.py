"""The console's Notifications pages: the list (KPI tiles and trends, globally or of one
channel, filters by status, channel, source and target, keyset paging), one notification
with its last error and, for operators, Retry and Discard of a Parked one (post, then a
redirect carrying the outcome in the signed flash cookie, docs/decisions.md "Console
actions answer with a redirect": the page shows it once, a reload sends nothing, and no
link can carry an outcome), and the channels and rules configured (secrets never shown:
a webhook by its origin only, ``WebhookChannel.origin``).

Source: docs/design.md "Notification outbox"; docs/decisions.md "The console calls the
same functions as the API": reads call ``notifications.queries`` (the trends
``db.kpi_history`` via ``web.charts``, as the site calls' do), the actions
``notifications.store.act_on_parked``, as the API does. Every value of a notification
(subject, target, body, error) is rendered as text.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response

from controlroom.config import NotificationRule, Settings
from controlroom.notifications import queries
from controlroom.notifications.lifecycle import TERMINAL, Channel, Status
from controlroom.notifications.store import ActionOutcome, Command, act_on_parked
from controlroom.web import charts
from controlroom.web.common import (
    EXTRA_NAV,
    PAGE_SIZE,
    Actor,
    After,
    Text,
    Viewer,
    api_state,
    engine_of,
    form_instant,
    kpi_tiles,
    redirect_with,
    refusing_bad_cursor,
    render,
)
from controlroom.web.filters import span
from controlroom.web.flash import Flash
from controlroom.web.sitecall_pages import render_rejected

router = APIRouter(include_in_schema=False)
STATUSES = tuple(status.value for status in Status)
CHANNELS = tuple(channel.value for channel in Channel)

EXTRA_NAV.append(("Notifications", "/notifications"))

# What an action did, as an operator reads it (the flash of its redirect).
NOT_PARKED_TEXT = "the notification is not Parked, so nothing was done."
COMMANDS = {command.value.lower(): command for command in Command}


def kpi_context(
    conn: sa.Connection, settings: Settings, *, channel: str | None = None
) -> dict[str, Any]:
    """The KPI tiles (``common.kpi_tiles``, as ``/api/notifications/kpis`` measures
    them) and the trend charts (``charts``) of one scope: every channel, or ``channel``."""
    now = datetime.now(UTC)
    scopes = queries.measure_kpis(
        conn,
        now=now,
        interval=settings.kpi.interval,
        stuck_threshold=settings.kpi.stuck_threshold,
    )
    trends = charts.kpi_charts(
        conn,
        now=now,
        source=charts.NOTIFICATIONS,
        interval=span(settings.kpi.interval),
        scope="channel" if channel else "global",
        scope_key=channel or "",
    )
    return {**kpi_tiles(scopes[channel or ""], settings, now), "charts": trends}


@router.get("/notifications")
def notification_list(
    request: Request,
    session: Viewer,
    status: Text = "",
    channel: Text = "",
    source: Text = "",
    target: Text = "",
    created_from: Annotated[str, Query(alias="from", max_length=40)] = "",
    created_to: Annotated[str, Query(alias="to", max_length=40)] = "",
    scope_channel: Text = "",
    after: After = "",
) -> Response:
    """KPI tiles and trends of the picked scope (``scope_channel``: every channel by
    default), the channels configured, and the notifications matching the filters
    (``from`` inclusive, ``to`` exclusive: created instants, UTC), newest created first."""
    if status and status not in STATUSES:
        raise HTTPException(400, f"status must be one of {', '.join(STATUSES)}")
    for name, value in (("channel", channel), ("scope_channel", scope_channel)):
        if value and value not in CHANNELS:
            raise HTTPException(400, f"{name} must be one of {', '.join(CHANNELS)}")
    filters = queries.NotificationFilter(
        status or None,
        channel or None,
        source or None,
        target or None,
        created_from=form_instant("from", created_from),
        created_to=form_instant("to", created_to),
    )
    settings: Settings = api_state(request).settings
    with engine_of(request).connect() as conn:
        with refusing_bad_cursor():
            page = queries.list_notifications(conn, filters, limit=PAGE_SIZE, after=after or None)
        context = kpi_context(conn, settings, channel=scope_channel or None)
    outbox = settings.notifications
    return render(
        request,
        "notifications.html",
        {
            **context,
            "notifications": page.rows,
            "next_cursor": page.next_cursor,
            "after": after,
            "params": {
                "status": status,
                "channel": channel,
                "source": source,
                "target": target,
                "from": created_from,
                "to": created_to,
                "scope_channel": scope_channel,
            },
            "statuses": STATUSES,
            "channels": CHANNELS,
            "scope_channel": scope_channel,
            "webhooks": [(hook.name, hook.origin) for hook in outbox.webhooks],
            "rules": [rule_row(rule) for rule in outbox.rules],
            "recipient_lists": [(entry.name, entry.addresses) for entry in outbox.recipient_lists],
            "smtp": None if outbox.smtp is None else f"{outbox.smtp.host}:{outbox.smtp.port}",
        },
    )


def rule_row(rule: NotificationRule) -> dict[str, Any]:
    """A rule as the page lists it: its filters in words (none: every event of its
    types)."""
    filters = [
        f"{name} {value}"
        for name, value in (
            ("endpoint", rule.endpoint),
            ("group", rule.group),
            ("site", rule.site),
            ("related to", rule.related_to),
        )
        if value is not None
    ]
    if rule.min_severity != "info":
        filters.append(f"at least {rule.min_severity}")
    return {
        "name": rule.name,
        "event_types": rule.event_types,
        "filters": filters,
        "channel": rule.channel,
        "target": rule.target,
        "window": rule.window,
        "severity": rule.severity,
    }


@router.get("/notifications/rejected")
def rejected_notifications(request: Request, session: Viewer, after: After = "") -> Response:
    """Notifications refused, kept whole with the reason, newest first (the rejected
    telemetry page's, for notifications)."""
    return render_rejected(request, after, notifications=True)


@router.get("/notifications/{notification_id}")
def notification_page(
    request: Request,
    session: Viewer,
    notification_id: uuid.UUID,
) -> Response:
    """One notification (and the flash of an action's redirect, shown once)."""
    return _notification(request, notification_id, "notification.html")


@router.get("/notifications/{notification_id}/state")
def notification_state(request: Request, session: Viewer, notification_id: uuid.UUID) -> Response:
    """The notification's state and actions alone; htmx polls it until it is terminal."""
    return _notification(request, notification_id, "_notification_state.html")


def _notification(request: Request, notification_id: uuid.UUID, template: str) -> Response:
    with engine_of(request).connect() as conn:
        row = queries.get_notification(conn, str(notification_id))
    if row is None:
        raise HTTPException(404, "notification not found")
    recipients = json.loads(row.recipients) if row.recipients else None
    return render(
        request,
        template,
        {
            "n": row,
            "parked": row.status == Status.PARKED.value,
            "terminal": row.status in TERMINAL,
            "recipients": recipients,
            "outcomes": recipient_outcomes(api_state(request).settings, row, recipients),
        },
    )


def recipient_outcomes(
    settings: Settings, row: Any, recipients: list[str] | None
) -> list[tuple[str, bool]] | None:
    """An e-mail's recipients, each with whether it has the notification
    (``delivered_to``: each recipient has its own outcome, docs/design.md "Notification
    channels"); ``None`` for a webhook, or a list no longer configured."""
    if row.channel != Channel.EMAIL.value:
        return None
    if recipients is None:
        configured = settings.notifications.recipients(row.target)
        if configured is None:
            return None
        recipients = configured.addresses
    delivered = set(json.loads(row.delivered_to)) if row.delivered_to else set()
    return [(address, address in delivered) for address in recipients]


@router.post("/notifications/{notification_id}/{command}")
def act(request: Request, session: Actor, notification_id: uuid.UUID, command: str) -> Response:
    """Retry or Discard a Parked notification (as the API does), then 303 to its page
    with the outcome in the flash; an id with no notification goes to the list, saying
    so."""
    chosen = COMMANDS.get(command)
    if chosen is None:
        raise HTTPException(404, "no such action")
    result = act_on_parked(
        engine_of(request),
        str(notification_id),
        chosen,
        session.principal.name,
        now=datetime.now(UTC),
    )
    if result.outcome is ActionOutcome.NOT_FOUND:
        text = (
            f"{chosen.value}: there is no notification {notification_id} (it may have been "
            "purged); nothing was done."
        )
        return redirect_with(request, "/notifications", Flash("error", text, code="NotFound"))
    if result.outcome is ActionOutcome.APPLIED:
        flash = Flash(
            "notice", f"{chosen.value}: the notification is {result.status}.", code="Applied"
        )
    else:
        flash = Flash(
            "error",
            f"{chosen.value}: {NOT_PARKED_TEXT}",
            code=result.outcome.value,
            detail=f"The notification is {result.status}.",
        )
    return redirect_with(request, f"/notifications/{notification_id}", flash)
