"""The site-call half of the API: telemetry intake, site calls, KPIs and their history,
the audit log, rejected telemetry.

Source: docs/design.md "Site call audit" and "KPIs"; docs/decisions.md "Telemetry intake
keeps what it refuses" and "Site-call lists page by keyset". Lists are newest first with
keyset paging: ``limit`` rows and ``next_cursor``, passed back as ``after`` for the next
page (``controlroom.sitecalls.queries``). Reading needs ``reader`` (``api.auth``),
re-submitting a rejected packet ``operator``; posting telemetry needs the posting site's
own token, and each packet must name that site (``api.auth.refuse_foreign_packets``: a
403 for the whole request, kept nowhere).

A telemetry request holds the writer at most ``audit.request_budget`` seconds: what is
left then is answered 503 with ``Retry-After``, the body saying which packets were taken,
which rejected and which not written (``unwritten``: send those again).
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, PlainSerializer

from controlroom.api.auth import current_principal, refuse_foreign_packets
from controlroom.api.parameters import invalid_parameter, refuse_unknown_or_repeated
from controlroom.config import Settings
from controlroom.db.kpi_history import Metric, read_series
from controlroom.http.bodies import packet_download
from controlroom.runtime.wire_text import is_wire_text_clean
from controlroom.sitecalls import queries
from controlroom.sitecalls.history import SOURCE, Scope
from controlroom.sitecalls.intake import make_writer, receive_json
from controlroom.sitecalls.kpis import measure_kpis
from controlroom.sitecalls.rejected import ResubmitOutcome, resubmit_rejected
from controlroom.sitecalls.writer import IngestBudgetExceeded
from controlroom.telemetry.json_arrays import array_elements
from controlroom.telemetry.ordering import Channel, SiteCallStatus
from controlroom.telemetry.stamps import Stamp, round_trip

router = APIRouter(tags=["site calls"], dependencies=[Depends(refuse_unknown_or_repeated)])

MAX_PACKETS_PER_POST = 1000
HTTP_ATTEMPTS = 3
RETRY_AFTER_SECONDS = 1
Limit = Annotated[int, Query(ge=1, le=500, description="Rows per page.")]
After = Annotated[
    str | None, Query(max_length=500, description="next_cursor of the previous page.")
]
Text = Annotated[str | None, Query(max_length=1024)]
StampBound = Annotated[
    Stamp | None,
    Query(description="ISO 8601 with a zone, at most 7 fractional digits (read to 100 ns)."),
]
# Every time answered in one format: a site's stamps (``Stamp``) and central's own times
# alike, UTC with seven fractional digits, the .NET round-trip format (README).
Time = Annotated[datetime, PlainSerializer(round_trip, return_type=str, when_used="json")]


async def sent_elements(request: Request) -> list[tuple[Any, bytes]]:
    """The request body's array elements, each decoded and as its bytes as sent
    (``telemetry.json_arrays``), the body read once: a refused one is kept as sent.
    Raises a 422 at ``["body"]`` for a body that is not one UTF-8 JSON array (RFC 8259:
    not UTF-8, UTF-16, ``NaN``, more after the array, an object) or is sent as another
    media type than JSON (FastAPI's own rule for a JSON body: ``application/json`` or
    ``application/*+json``; none given reads as JSON)."""
    content_type = request.headers.get("content-type")
    if content_type is not None:
        media = content_type.partition(";")[0].strip().lower()
        kind, _, subtype = media.partition("/")
        if kind != "application" or not (subtype == "json" or subtype.endswith("+json")):
            raise _body_refused(f"send one JSON array as application/json, not {media!r}")
    try:
        return array_elements(await request.body())
    except ValueError as exc:
        raise _body_refused(f"not one UTF-8 JSON array: {exc}") from None


def _body_refused(message: str) -> RequestValidationError:
    return RequestValidationError([{"type": "value_error", "loc": ("body",), "msg": message}])


def json_array_body(description: str) -> dict[str, Any]:
    """``openapi_extra`` of a route whose body ``sent_elements`` reads: one JSON array."""
    schema = {"type": "array", "items": {}}
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {"application/json": {"schema": schema}},
        }
    }


SentElements = Annotated[list[tuple[Any, bytes]], Depends(sent_elements)]
"""A route's body: its array's elements, decoded and as sent, in order."""

BAD_REQUEST: dict[int | str, dict[str, Any]] = {
    400: {"description": "A parameter is malformed (named in detail)."}
}
BUSY: dict[int | str, dict[str, Any]] = {
    503: {"description": "The store is busy or a write ran past its budget; try again."}
}


class SiteCallView(BaseModel):
    tracked_operation_id: str
    channel: str
    target: str
    source_site: str
    source_node: str | None
    status: str
    retry_count: int
    last_error: str | None
    http_status: int | None
    created_at_utc: Stamp
    updated_at_utc: Stamp
    terminal_at_utc: Stamp | None
    ingested_at_utc: Time
    epoch: int


class AuditEventView(BaseModel):
    event_id: str
    occurred_at_utc: Stamp
    ingested_at_utc: Time
    actor: str
    action: str
    outcome: str
    category: str
    target: str | None
    source_site: str | None
    source_node: str | None
    correlation_id: str | None
    details_json: str | None
    payload_truncated: bool


class SiteCallPage(BaseModel):
    items: list[SiteCallView]
    next_cursor: str | None


class SiteCallDetails(SiteCallView):
    audit_events: list[AuditEventView]


class AuditPage(BaseModel):
    items: list[AuditEventView]
    next_cursor: str | None


class RejectedPacketView(BaseModel):
    id: str
    source: str
    packet: str
    """The packet's first ``PACKET_PREVIEW_BYTES`` bytes as received (UTF-8; undecodable
    bytes, a character cut at the end too, shown as U+FFFD)."""
    packet_size: int
    """Bytes of the whole packet."""
    packet_truncated: bool
    """Whether ``packet`` is only its beginning; ``packet_url`` serves it whole."""
    packet_url: str
    reason: str
    rejected_at_utc: Time


class RejectedPage(BaseModel):
    items: list[RejectedPacketView]
    next_cursor: str | None


class PacketRejection(BaseModel):
    index: int
    """Position of the packet in the posted list."""
    tracked_operation_id: str | None
    reason: str


class TelemetryAnswer(BaseModel):
    accepted: list[int]
    """Positions of the packets taken (stored, or a no-op under the monotonic rule)."""
    rejected: list[PacketRejection]


class TelemetryLeftOver(TelemetryAnswer):
    detail: str
    unwritten: list[int]
    """Positions of the packets not written (the budget ran out): send them again."""


class ResubmissionView(BaseModel):
    id: str
    outcome: ResubmitOutcome
    reason: str | None
    """Why it was rejected again (``outcome`` ``Rejected``)."""
    tracked_operation_id: str | None


class Kpis(BaseModel):
    at_utc: Time
    scope: Literal["global", "site", "node"]
    scope_key: str
    interval_seconds: float
    stuck_threshold_seconds: float
    buffered: int
    parked: int
    failed_last_interval: int
    delivered_last_interval: int
    oldest_pending_age_seconds: float | None
    stuck: int


class SeriesPointView(BaseModel):
    captured_at_utc: Time
    value: float
    min: float
    max: float
    samples: int


class KpiSeries(BaseModel):
    metric: str
    scope: str
    scope_key: str
    from_utc: Stamp
    to_utc: Stamp
    points: list[SeriesPointView]


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = request.app.state.engine
    return engine


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _paged(page: queries.Page, stamps: tuple[str, ...]) -> dict[str, Any]:
    items = [queries.with_stamps(row, stamps) for row in page.rows]
    return {"items": items, "next_cursor": page.next_cursor}


def _bad_cursor(exc: queries.BadCursor, after: str | None) -> Exception:
    """A cursor the list did not hand out: a bad parameter, a 422 naming ``after``."""
    return invalid_parameter("query", "after", after, str(exc))


@router.post(
    "/site-calls/telemetry",
    response_model=TelemetryAnswer,
    responses={
        503: {
            "model": TelemetryLeftOver,
            "description": "The request's budget ran out (or the store is busy): the "
            "packets in unwritten were not written; send them again after Retry-After.",
        },
        413: {},
    },
    openapi_extra=json_array_body("Telemetry packets (README)."),
)
def post_telemetry(request: Request, sent: SentElements) -> Any:
    """Take a list of telemetry packets; answers which were accepted and which rejected,
    and why. A rejected packet is kept whole, as the bytes sent, and listed by
    ``/api/site-calls/rejected``. A packet naming a site other than the token's makes the
    whole request a 403, kept nowhere. A body that is not one UTF-8 JSON array is refused
    whole (``sent_elements``)."""
    packets = [value for value, _ in sent]
    if len(packets) > MAX_PACKETS_PER_POST:
        raise HTTPException(413, f"at most {MAX_PACKETS_PER_POST} packets per request")
    refuse_foreign_packets(request, packets)
    received = [receive_json(value, "http", raw) for value, raw in sent]
    writer = make_writer(
        _settings(request),
        _engine(request),
        attempts=HTTP_ATTEMPTS,
        on_written=request.app.state.on_telemetry_written,
    )
    try:
        reasons = writer.write(received)
    except IngestBudgetExceeded as stopped:
        left = set(stopped.unwritten)
        done = [None if index in left else reason for index, reason in enumerate(stopped.reasons)]
        body = _answer(packets, done, skip=left)
        body.update(detail=f"{stopped}; send the unwritten packets again", unwritten=sorted(left))
        return JSONResponse(body, 503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    return _answer(packets, reasons, skip=set())


def _answer(packets: list[Any], reasons: list[str | None], *, skip: set[int]) -> dict[str, Any]:
    """The accepted and rejected positions of ``packets`` (but those in ``skip``)."""
    rejected = []
    for index, (item, reason) in enumerate(zip(packets, reasons, strict=True)):
        if reason is not None:
            op_id = item.get("tracked_operation_id") if isinstance(item, dict) else None
            rejected.append(
                {
                    "index": index,
                    "tracked_operation_id": op_id
                    if isinstance(op_id, str) and is_wire_text_clean(op_id)
                    else None,
                    "reason": reason,
                }
            )
    accepted = [
        index for index, reason in enumerate(reasons) if reason is None and index not in skip
    ]
    return {"accepted": accepted, "rejected": rejected}


@router.get("/site-calls", response_model=SiteCallPage, responses=BAD_REQUEST)
def list_site_calls(
    request: Request,
    site: Text = None,
    node: Text = None,
    status: Annotated[SiteCallStatus | None, Query()] = None,
    channel: Annotated[Channel | None, Query()] = None,
    target: Text = None,
    created_from: StampBound = None,
    created_to: StampBound = None,
    limit: Limit = 50,
    after: After = None,
) -> dict[str, Any]:
    """Site calls, newest created first; filters combine with AND. A parameter given
    more than once is a 400 (never silently one of its values)."""
    filters = queries.SiteCallFilter(
        site,
        node,
        status and status.value,
        channel and channel.value,
        target,
        created_from,
        created_to,
    )
    try:
        with _engine(request).connect() as conn:
            page = queries.list_site_calls(conn, filters, limit=limit, after=after)
            return _paged(page, queries.SITE_CALL_STAMPS)
    except queries.BadCursor as exc:
        raise _bad_cursor(exc, after) from None


@router.get("/site-calls/kpis", response_model=Kpis, responses=BAD_REQUEST)
def site_call_kpis(request: Request, site: Text = None, node: Text = None) -> dict[str, Any]:
    """The KPIs now: globally, of one source ``site``, or of one ``node`` of a site."""
    if node is not None and site is None:
        raise HTTPException(400, "node: give the site too (a node is named within its site)")
    settings = _settings(request)
    now = datetime.now(UTC)
    with _engine(request).connect() as conn:
        report = measure_kpis(
            conn,
            now=now,
            interval=settings.kpi.interval,
            stuck_threshold=settings.kpi.stuck_threshold,
            site=site,
            node=node,
        )
    scope = "node" if node is not None else "site" if site is not None else "global"
    key = f"{site}/{node}" if node is not None else site or ""
    return {
        "at_utc": now,
        "scope": scope,
        "scope_key": key,
        "interval_seconds": settings.kpi.interval.total_seconds(),
        "stuck_threshold_seconds": settings.kpi.stuck_threshold.total_seconds(),
        **report.total().as_dict(now),
    }


@router.get("/site-calls/rejected", response_model=RejectedPage, responses=BAD_REQUEST)
def list_rejected(request: Request, limit: Limit = 50, after: After = None) -> dict[str, Any]:
    """Telemetry packets the contract or the store refused, newest first, kept whole."""
    return rejected_page(request, limit, after)


def rejected_page(
    request: Request, limit: int, after: str | None, *, notifications: bool = False
) -> dict[str, Any]:
    """A ``RejectedPage`` of rejected telemetry, or of rejected notifications
    (``queries.list_rejected_telemetry``). A bad cursor is a 422 naming ``after``."""
    try:
        with _engine(request).connect() as conn:
            page = queries.list_rejected_telemetry(
                conn, limit=limit, after=after, notifications=notifications
            )
    except queries.BadCursor as exc:
        raise _bad_cursor(exc, after) from None
    items = [
        {
            **row._asdict(),
            "packet": bytes(row.packet).decode("utf-8", "replace"),
            "packet_truncated": row.packet_size > len(row.packet),
            "packet_url": f"/api/{'notifications' if notifications else 'site-calls'}"
            f"/rejected/{row.id}/packet",
        }
        for row in page.rows
    ]
    return {"items": items, "next_cursor": page.next_cursor}


RejectedId = Annotated[uuid.UUID, Path(alias="id")]


def packet_responses(missing: str) -> dict[int | str, dict[str, Any]]:
    """The answers of a route that downloads a kept packet (``rejected_download``)."""
    return {200: {"content": {"application/octet-stream": {}}}, 404: {"description": missing}}


def rejected_download(
    request: Request, rejected_id: uuid.UUID, *, notifications: bool | None, what: str
) -> Response:
    """The kept packet ``rejected_id`` whole, as received, as a download (``attachment``;
    octet-stream, so a browser never renders it); ``notifications`` as
    ``queries.rejected_packet`` takes it. Raises ``HTTPException`` 404 "no ``what`` with
    id ..." when none of that kind has the id."""
    with _engine(request).connect() as conn:
        packet = queries.rejected_packet(conn, str(rejected_id), notifications=notifications)
    if packet is None:
        raise HTTPException(404, f"no {what} with id {rejected_id}")
    return packet_download(packet, str(rejected_id))


@router.get(
    "/site-calls/rejected/{id}/packet",
    response_class=Response,
    responses=packet_responses("No rejected packet has this id."),
)
def download_rejected_packet(request: Request, rejected_id: RejectedId) -> Response:
    """The whole rejected packet as received (either kind: links handed out before
    notifications had their own path keep working)."""
    return rejected_download(request, rejected_id, notifications=None, what="rejected packet")


@router.post(
    "/site-calls/rejected/{id}/resubmit",
    response_model=ResubmissionView,
    responses={
        404: {"description": "No rejected packet has this id."},
        409: {"model": ResubmissionView, "description": "Rejected again; reason says why."},
        503: BUSY[503],
    },
)
def resubmit_rejected_packet(
    request: Request, rejected_id: Annotated[uuid.UUID, Path(alias="id")]
) -> Any:
    """Write a rejected packet again once its cause is fixed (operator). Accepted: 200,
    and the rejected packet is removed; rejected again: 409 with the reason, which the
    kept packet now shows. Either way the event log names the operator."""
    writer = make_writer(_settings(request), _engine(request), attempts=HTTP_ATTEMPTS)
    try:
        result = resubmit_rejected(
            _engine(request), writer, str(rejected_id), current_principal(request).name
        )
    except IngestBudgetExceeded as exc:
        raise HTTPException(
            503, str(exc), headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        ) from exc
    if result is None:
        raise HTTPException(404, f"no rejected packet with id {rejected_id}")
    body = dataclasses.asdict(result)
    return JSONResponse(body, 200 if result.outcome is ResubmitOutcome.ACCEPTED else 409)


@router.get(
    "/site-calls/{id}",
    response_model=SiteCallDetails,
    responses={404: {"description": "No site call has this id."}},
)
def get_site_call(
    request: Request,
    tracked_operation_id: Annotated[uuid.UUID, Path(alias="id")],
) -> dict[str, Any]:
    """One site call with its audit events (by correlation id), oldest event first."""
    key = str(tracked_operation_id)
    with _engine(request).connect() as conn:
        row = queries.get_site_call(conn, key)
        if row is None:
            raise HTTPException(404, f"no site call with tracked_operation_id {key}")
        events = queries.audit_events_of(conn, key)
    return {
        **queries.with_stamps(row, queries.SITE_CALL_STAMPS),
        "audit_events": [queries.with_stamps(event, queries.AUDIT_STAMPS) for event in events],
    }


@router.get("/audit-log", response_model=AuditPage, responses=BAD_REQUEST)
def list_audit_log(
    request: Request,
    actor: Text = None,
    action: Text = None,
    outcome: Text = None,
    category: Text = None,
    target: Text = None,
    correlation_id: Text = None,
    occurred_from: StampBound = None,
    occurred_to: StampBound = None,
    limit: Limit = 50,
    after: After = None,
) -> dict[str, Any]:
    """Audit events, newest first; filters combine with AND."""
    filters = queries.AuditFilter(
        actor, action, outcome, category, target, correlation_id, occurred_from, occurred_to
    )
    try:
        with _engine(request).connect() as conn:
            page = queries.list_audit_events(conn, filters, limit=limit, after=after)
            return _paged(page, queries.AUDIT_STAMPS)
    except queries.BadCursor as exc:
        raise _bad_cursor(exc, after) from None


SeriesFrom = Annotated[
    Stamp | None,
    Query(alias="from", description="ISO 8601 with a zone, at most 7 fractional digits."),
]
"""A series' ``from``: a ``StampBound`` under the name a keyword takes."""

MaxPoints = Annotated[int, Query(ge=1, le=10_000)]
_DAY = timedelta(hours=24)


@router.get("/kpi-history", response_model=KpiSeries, responses=BAD_REQUEST)
def kpi_history(
    request: Request,
    metric: Annotated[Metric, Query()],
    scope: Annotated[Scope, Query()] = "global",
    scope_key: Annotated[str, Query(max_length=200)] = "",
    from_: SeriesFrom = None,
    to: StampBound = None,
    max_points: MaxPoints = 200,
) -> dict[str, Any]:
    """One KPI's samples of one scope (``global``; ``site`` keyed by the site; ``node``
    keyed ``site/node``) in ``[from, to]`` (default: the last 24 hours), downsampled to
    at most ``max_points`` points (the mean, minimum and maximum of each equal slice)."""
    site, slash, node = scope_key.partition("/")
    if scope == "node" and not (slash and site and node):
        raise invalid_parameter("query", "scope_key", scope_key, "a node's key is site/node")
    return kpi_series(
        request, SOURCE, metric, scope, scope_key, start=from_, end=to, max_points=max_points
    )


def kpi_series(
    request: Request,
    source: str,
    metric: str,
    scope: str,
    scope_key: str,
    *,
    start: Stamp | None,
    end: Stamp | None,
    max_points: int,
) -> dict[str, Any]:
    """The answer (``KpiSeries``) of a KPI history route: one metric's series of one
    scope of ``source`` (``db.kpi_history.read_series``); ``end`` defaults to now,
    ``start`` to 24 hours before it (at the earliest, year 1's first instant). Raises
    ``HTTPException`` 400 when ``start`` is after ``end``, a 422 naming ``scope_key``
    when it is given for ``global`` or missing for any other scope (no sample has such a
    key: the series would be empty, as if nothing happened). Shared with
    ``/api/notifications/kpi-history``."""
    if (scope == "global") != (scope_key == ""):
        needs = "must be empty for global" if scope == "global" else f"is required for {scope}"
        raise invalid_parameter("query", "scope_key", scope_key, f"scope_key {needs}")
    end = end or Stamp.of(datetime.now(UTC))
    first = datetime.min.replace(tzinfo=UTC)  # a day before the first day is no datetime
    day_before = end.instant - timedelta(hours=24) if end.instant - first > _DAY else first
    start = start or Stamp.of(day_before)
    if start > end:
        raise HTTPException(400, "from: must not be after to")
    # Samples are central's own times, to the microsecond: a bound's 100 ns past one puts
    # `from` at the next (`to` is inclusive: its microsecond holds).
    lower = start.instant + timedelta(microseconds=1) if start.tick else start.instant
    with _engine(request).connect() as conn:
        points = read_series(
            conn,
            source=source,
            metric=metric,
            scope=scope,
            scope_key=scope_key,
            start=lower,
            end=end.instant,
            max_points=max_points,
        )
    return {
        "metric": metric,
        "scope": scope,
        "scope_key": scope_key,
        "from_utc": start,
        "to_utc": end,
        "points": [dataclasses.asdict(point) for point in points],
    }
