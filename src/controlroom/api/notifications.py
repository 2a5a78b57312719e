"""The notification outbox's API (docs/design.md "Notification outbox"), with the site
calls' auth matrix (``api.auth``: readers GET, operators POST):

- ``GET /api/notifications``: newest created first, filtered by ``status``, ``channel``,
  ``source``, ``target``; keyset paging (``limit``, ``after`` = ``next_cursor``); each
  at most once (400 otherwise).
- ``GET /api/notifications/kpis``: the KPIs, globally and per channel.
- ``GET /api/notifications/kpi-history``: one KPI's sampled series, globally or of one
  channel (``scope=channel``, ``scope_key`` its name), as ``/api/kpi-history`` answers
  the site calls'.
- ``GET /api/notifications/{id}``: one notification with its body (never a secret, a
  payload or a claim).
- ``POST /api/site-notifications`` (a site's own token, as its telemetry): a list of a
  site's notifications (``notification_id``, ``source_site``, ``channel``, ``target``,
  ``subject``, ``body``, ``severity``; or, for e-mail, ``recipients``, a list of
  addresses, instead of ``target``), each stored as ``site:<source_site>``, idempotent
  on its id; answers the accepted positions and the rejected ones with a reason naming
  the field (nothing is truncated); a rejected one is kept whole, as posted. Addresses
  are taken only in the site's ``sites[].recipient_domains`` (docs/decisions.md
  "Explicit recipients of a site's notification").
- ``GET /api/notifications/rejected``: notifications refused, kept whole with the reason
  (``rejected_telemetry``, source ``notification:...``), newest first, as
  ``/api/site-calls/rejected`` lists telemetry; each downloads whole at
  ``/api/notifications/rejected/{id}/packet`` (its ``packet_url``).
- ``POST /api/notifications/{id}/retry|discard`` (operator): ``{"outcome", "status",
  "message"}``: Applied 200, NotParked 409 (with the current status), 404 "notification
  not found" when no row exists (e.g. purged); an audit event only when applied.
"""

from __future__ import annotations

import enum
import json
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from controlroom.api.auth import current_principal, refuse_foreign_packets
from controlroom.api.parameters import invalid_parameter, refuse_unknown_or_repeated
from controlroom.api.sitecalls import (
    BAD_REQUEST,
    KpiSeries,
    MaxPoints,
    RejectedId,
    RejectedPage,
    SentElements,
    SeriesFrom,
    StampBound,
    Time,
    json_array_body,
    kpi_series,
    packet_responses,
    rejected_download,
    rejected_page,
)
from controlroom.config import Settings
from controlroom.db.kpi_history import Metric
from controlroom.db.transactions import begin_write
from controlroom.notifications import queries
from controlroom.notifications.history import SOURCE
from controlroom.notifications.lifecycle import Channel, Status
from controlroom.notifications.store import (
    ActionOutcome,
    Command,
    NewNotification,
    NotificationRejected,
    act_on_parked,
    check,
    enqueue,
    keep_rejected,
    notification_id_of,
    rejected_source,
)
from controlroom.runtime.wire_text import is_wire_text_clean
from controlroom.telemetry.contract import validated
from controlroom.telemetry.notification import ForwardedNotification, domain_of
from controlroom.telemetry.stamps import round_trip

router = APIRouter(tags=["notifications"], dependencies=[Depends(refuse_unknown_or_repeated)])

Limit = Annotated[int, Query(ge=1, le=500, description="Rows per page.")]
After = Annotated[
    str | None, Query(max_length=500, description="next_cursor of the previous page.")
]
Text = Annotated[str | None, Query(max_length=1024)]
NotificationId = Annotated[
    uuid.UUID, Path(description="The notification's notification_id (a GUID, in any case).")
]

_STATUS = {ActionOutcome.APPLIED: 200, ActionOutcome.NOT_PARKED: 409}
MAX_NOTIFICATIONS_PER_POST = 1000


class NotificationStatus(enum.StrEnum):
    PENDING = Status.PENDING.value
    RETRYING = Status.RETRYING.value
    DELIVERED = Status.DELIVERED.value
    FAILED = Status.FAILED.value
    PARKED = Status.PARKED.value
    DISCARDED = Status.DISCARDED.value


class NotificationChannel(enum.StrEnum):
    EMAIL = Channel.EMAIL.value
    WEBHOOK = Channel.WEBHOOK.value


class NotificationView(BaseModel):
    notification_id: str
    source: str
    channel: str
    target: str
    subject: str
    severity: str
    status: str
    retry_count: int
    last_error: str | None
    reply_code: int | None
    created_at_utc: Time
    updated_at_utc: Time
    next_attempt_at_utc: Time | None
    terminal_at_utc: Time | None
    source_event_id: str | None


class NotificationDetail(NotificationView):
    body: str
    recipients: list[str] | None
    delivered_to: list[str] | None
    """E-mail: the recipients that have it (each recipient has its own outcome)."""
    event_count: int | None
    """A rule's: the events coalesced into it."""


class NotificationPage(BaseModel):
    items: list[NotificationView]
    next_cursor: str | None


class KpiView(BaseModel):
    buffered: int
    parked: int
    failed_last_interval: int
    delivered_last_interval: int
    oldest_pending_age_seconds: float | None
    stuck: int


class ActionView(BaseModel):
    outcome: str
    status: str
    message: str


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = request.app.state.engine
    return engine


@router.get("/notifications/rejected", response_model=RejectedPage, responses=BAD_REQUEST)
def list_rejected_notifications(
    request: Request, limit: Limit = 50, after: After = None
) -> dict[str, Any]:
    """Notifications refused (a site's item as posted, or a rule's rendering), newest
    first, kept whole with the reason, beside rejected telemetry; each downloads whole
    at its ``packet_url``."""
    return rejected_page(request, limit, after, notifications=True)


@router.get(
    "/notifications/rejected/{id}/packet",
    response_class=Response,
    responses=packet_responses("No rejected notification has this id."),
)
def download_rejected_notification(request: Request, rejected_id: RejectedId) -> Response:
    """A refused notification whole, as received (as ``GET
    /api/site-calls/rejected/{id}/packet`` serves rejected telemetry)."""
    return rejected_download(request, rejected_id, notifications=True, what="rejected notification")


@router.get(
    "/notifications",
    response_model=NotificationPage,
    responses={
        400: {
            "description": "after is not a cursor this service handed out, or a parameter "
            "is given more than once."
        }
    },
)
def list_notifications(
    request: Request,
    status: Annotated[NotificationStatus | None, Query()] = None,
    channel: Annotated[NotificationChannel | None, Query()] = None,
    source: Text = None,
    target: Text = None,
    limit: Limit = 50,
    after: After = None,
) -> dict[str, Any]:
    """Notifications, newest created first; filters combine with AND. A parameter given
    more than once is a 400 (never silently one of its values)."""
    filters = queries.NotificationFilter(
        status and status.value, channel and channel.value, source, target
    )
    try:
        with _engine(request).connect() as conn:
            page = queries.list_notifications(conn, filters, limit=limit, after=after)
    except queries.BadCursor as exc:
        raise invalid_parameter("query", "after", after, str(exc)) from None
    return {"items": [row._asdict() for row in page.rows], "next_cursor": page.next_cursor}


@router.get("/notifications/kpis")
def notification_kpis(request: Request) -> dict[str, Any]:
    """The KPIs now: ``global`` and per channel (``channels``)."""
    settings: Settings = request.app.state.settings
    now = datetime.now(UTC)
    with _engine(request).connect() as conn:
        scopes = queries.measure_kpis(
            conn,
            now=now,
            interval=settings.kpi.interval,
            stuck_threshold=settings.kpi.stuck_threshold,
        )
    view = {key: KpiView.model_validate(kpis) for key, kpis in scopes.items()}
    return {
        "generated_at_utc": round_trip(now),
        "global": view.pop("").model_dump(),
        "channels": {key: value.model_dump() for key, value in view.items()},
    }


@router.get("/notifications/kpi-history", response_model=KpiSeries, responses=BAD_REQUEST)
def notification_kpi_history(
    request: Request,
    metric: Annotated[Metric, Query()],
    scope: Annotated[Literal["global", "channel"], Query()] = "global",
    scope_key: Annotated[str, Query(max_length=200)] = "",
    from_: SeriesFrom = None,
    to: StampBound = None,
    max_points: MaxPoints = 200,
) -> dict[str, Any]:
    """One KPI's samples of one scope (``global``; ``channel`` keyed by its name) in
    ``[from, to]`` (default: the last 24 hours), downsampled to at most ``max_points``
    points (the mean, minimum and maximum of each equal slice)."""
    if scope == "channel" and scope_key not in set(Channel):
        channels = ", ".join(Channel)
        raise invalid_parameter("query", "scope_key", scope_key, f"a channel: {channels}")
    return kpi_series(
        request, SOURCE, metric, scope, scope_key, start=from_, end=to, max_points=max_points
    )


@router.get(
    "/notifications/{notification_id}",
    response_model=NotificationDetail,
    responses={404: {"description": "No notification has this id."}},
)
def get_notification(notification_id: NotificationId, request: Request) -> dict[str, Any]:
    """One notification, with its body."""
    with _engine(request).connect() as conn:
        row = queries.get_notification(conn, str(notification_id))
    if row is None:
        raise HTTPException(404, "notification not found")
    shown = row._asdict()
    for listed in ("recipients", "delivered_to"):
        if shown[listed] is not None:
            shown[listed] = json.loads(shown[listed])
    return shown


def _act(notification_id: uuid.UUID, command: Command, request: Request) -> JSONResponse:
    result = act_on_parked(
        _engine(request),
        str(notification_id),
        command,
        current_principal(request).name,
        now=datetime.now(UTC),
    )
    if result.outcome is ActionOutcome.NOT_FOUND or result.status is None:
        raise HTTPException(404, "notification not found")
    if result.outcome is ActionOutcome.APPLIED:
        message = f"{command.value} applied: the notification is {result.status}"
    else:
        message = f"only a Parked notification can be acted on; this one is {result.status}"
    return JSONResponse(
        {"outcome": result.outcome.value, "status": result.status, "message": message},
        _STATUS[result.outcome],
    )


_ACTION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": ActionView, "description": "Applied."},
    404: {"description": "notification not found (never stored, or purged)."},
    409: {"model": ActionView, "description": "NotParked: status says what it is."},
}


@router.post("/notifications/{notification_id}/retry", responses=_ACTION_RESPONSES)
def retry_notification(notification_id: NotificationId, request: Request) -> JSONResponse:
    """An operator's Retry of a Parked notification: Pending and due now."""
    return _act(notification_id, Command.RETRY, request)


@router.post("/notifications/{notification_id}/discard", responses=_ACTION_RESPONSES)
def discard_notification(notification_id: NotificationId, request: Request) -> JSONResponse:
    """An operator's Discard of a Parked notification: Discarded, terminal."""
    return _act(notification_id, Command.DISCARD, request)


@router.post(
    "/site-notifications",
    openapi_extra=json_array_body("A site's notifications (module docstring)."),
)
def post_site_notifications(request: Request, sent: SentElements) -> dict[str, Any]:
    """Store a site's notifications for delivery; answers ``{"accepted": [positions],
    "rejected": [{"index", "notification_id", "reason"}]}``. An item naming another site
    than the token's makes the whole request a 403."""
    items = [value for value, _ in sent]
    if len(items) > MAX_NOTIFICATIONS_PER_POST:
        raise HTTPException(413, f"at most {MAX_NOTIFICATIONS_PER_POST} notifications per request")
    refuse_foreign_packets(request, items)
    rejected: list[dict[str, Any]] = []
    settings: Settings = request.app.state.settings
    now = datetime.now(UTC)
    parsed: list[tuple[int, NewNotification]] = []
    refused: list[tuple[Any, bytes, str]] = []
    for index, (item, raw) in enumerate(sent):
        try:
            notification = _site_notification(item)
            check(notification)
            _refuse_foreign_domains(settings, notification)
        except NotificationRejected as exc:
            given = item.get("notification_id") if isinstance(item, dict) else None
            refused.append((item, raw, str(exc)))
            rejected.append(
                {
                    "index": index,
                    "notification_id": given
                    if isinstance(given, str) and is_wire_text_clean(given)
                    else None,
                    "reason": str(exc),
                }
            )
            continue
        parsed.append((index, notification))
    with begin_write(_engine(request)) as conn:
        for item, raw, reason in refused:  # kept as sent, listed like rejected telemetry
            site = item.get("source_site") if isinstance(item, dict) else None
            keep_rejected(conn, rejected_source(site), item, reason, now=now, sent=raw)
        for _, notification in sorted(parsed, key=lambda pair: notification_id_of(pair[1])):
            enqueue(conn, notification, now=now)  # in id order: overlapping posts never deadlock
    accepted = [index for index, _ in parsed]
    return {"accepted": accepted, "rejected": rejected}


def _refuse_foreign_domains(settings: Settings, notification: NewNotification) -> None:
    """Refuse explicit addresses outside the sending site's ``recipient_domains``
    (docs/decisions.md "Explicit recipients of a site's notification"). Raises
    ``NotificationRejected`` naming the first address refused."""
    if notification.recipients is None:
        return
    site_id = notification.source.removeprefix("site:")
    site = next((entry for entry in settings.sites if entry.id == site_id), None)
    if site is None and notification.recipients:
        raise NotificationRejected(
            "recipients",
            f"{notification.recipients[0]}: site {site_id} is not in central's sites, so it "
            "may mail no address of its own (an entry's recipient_domains)",
        )
    allowed = frozenset(d.lower() for d in site.recipient_domains) if site else frozenset()
    for address in notification.recipients:
        if domain_of(address) not in allowed:
            raise NotificationRejected(
                "recipients",
                f"{address}: site {site_id} may not mail {domain_of(address)} "
                "(central's sites[].recipient_domains of the site)",
            )


def _site_notification(item: Any) -> NewNotification:
    """A site's notification as the store takes it, held to the agent's own contract
    (``telemetry.notification.ForwardedNotification``). Raises ``NotificationRejected``
    naming every field at fault."""
    if not isinstance(item, dict):
        raise NotificationRejected("notification", "must be a JSON object")
    try:
        forwarded = validated(ForwardedNotification, item, "a site's notification")
    except ValueError as refused:
        field, _, reason = str(refused).partition(": ")
        raise NotificationRejected(field, reason) from None
    return NewNotification(
        source=f"site:{forwarded.source_site}",
        channel=forwarded.channel,
        target=forwarded.destination,  # the label is central's own, not the one sent
        recipients=None if forwarded.recipients is None else tuple(forwarded.recipients),
        subject=forwarded.subject,
        body=forwarded.body,
        severity=forwarded.severity,
        notification_id=forwarded.notification_id,
    )
