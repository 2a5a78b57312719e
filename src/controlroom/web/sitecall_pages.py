"""The console's site-call pages: site calls (KPI tiles, trends, the filterable list), one
call with its audit events and the Retry/Discard relay, rejected telemetry (and its
re-submission: post, redirect, then the page shows the outcome), the sites'
reconciliation state, and the audit log.

Source: docs/design.md "Site call audit" and "Audit log"; docs/decisions.md "The console
calls the same functions as the API". Reads call ``controlroom.sitecalls``
(``queries``, ``kpis``, ``history`` via ``web.charts``, ``reconciliation.site_states``);
the relay is ``sitecalls.relay.relay_command``, the same the API calls. Lists are newest
first with keyset paging (``after`` is the previous page's cursor). Every value from a
site (targets, errors, actors, details, packets) is rendered as text. A filter value that
cannot be read answers 400 naming it.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlencode

import sqlalchemy as sa
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response

from controlroom.config import Settings
from controlroom.http.bodies import packet_download
from controlroom.sitecalls import queries
from controlroom.sitecalls.audit_verify import last_verification
from controlroom.sitecalls.history import node_scope_key
from controlroom.sitecalls.intake import make_writer
from controlroom.sitecalls.kpis import measure_kpis
from controlroom.sitecalls.reconciliation import site_states
from controlroom.sitecalls.rejected import ResubmitOutcome, resubmit_rejected
from controlroom.sitecalls.relay import (
    Command,
    RelayOutcome,
    relay_command,
    unrelayable_reason,
)
from controlroom.sitecalls.writer import IngestBudgetExceeded
from controlroom.telemetry.ordering import Channel, SiteCallStatus, is_terminal
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
    form_stamp,
    kpi_tiles,
    redirect,
    redirect_with,
    refusing_bad_cursor,
    render,
)
from controlroom.web.filters import span
from controlroom.web.flash import Flash
from controlroom.web.session import Session

router = APIRouter(include_in_schema=False)
WRITE_ATTEMPTS = 3  # transient store errors a re-submission rides out before it answers
STATUSES = tuple(status.value for status in SiteCallStatus)
CHANNELS = tuple(channel.value for channel in Channel)

EXTRA_NAV.extend([("Site calls", "/site-calls"), ("Sites", "/sites"), ("Audit log", "/audit-log")])

# The relay's outcome as an operator reads it (the relay's own sentence follows it).
OUTCOME_TEXT = {
    RelayOutcome.APPLIED: "the site applied the command.",
    RelayOutcome.NOT_PARKED: "the call is not Parked, so nothing was done.",
    RelayOutcome.SITE_UNREACHABLE: "the site could not be reached.",
    RelayOutcome.OPERATION_FAILED: "the site did not apply the command.",
}


# --- KPIs (the dashboard shows the global ones too) -------------------------------------
def kpi_context(
    conn: sa.Connection, settings: Settings, *, site: str | None = None, node: str | None = None
) -> dict[str, Any]:
    """The KPI tiles (``kpi_tiles_context``) and the trend charts (``charts``) of one
    scope."""
    tiles = kpi_tiles_context(conn, settings, site=site, node=node)
    if node is not None and site is not None:
        scope, key = "node", node_scope_key(site, node)
    elif site is not None:
        scope, key = "site", site
    else:
        scope, key = "global", ""
    trends = charts.kpi_charts(
        conn, now=tiles["now"], interval=span(settings.kpi.interval), scope=scope, scope_key=key
    )
    return {**tiles, "charts": trends}


def kpi_tiles_context(
    conn: sa.Connection, settings: Settings, *, site: str | None = None, node: str | None = None
) -> dict[str, Any]:
    """The KPI tiles of one scope (``kpis``: the figures by metric name, as
    ``/api/site-calls/kpis`` answers them), the labels the tiles need, and ``now``."""
    now = datetime.now(UTC)
    report = measure_kpis(
        conn,
        now=now,
        interval=settings.kpi.interval,
        stuck_threshold=settings.kpi.stuck_threshold,
        site=site,
        node=node,
    )
    return kpi_tiles(report.total().as_dict(now), settings, now)


# --- site calls ---------------------------------------------------------------------------
@router.get("/site-calls")
def site_call_list(
    request: Request,
    session: Viewer,
    site: Text = "",
    node: Text = "",
    status: Text = "",
    channel: Text = "",
    target: Text = "",
    created_from: Annotated[str, Query(alias="from", max_length=40)] = "",
    created_to: Annotated[str, Query(alias="to", max_length=40)] = "",
    scope_site: Text = "",
    scope_node: Text = "",
    after: After = "",
) -> Response:
    """KPI tiles and trends of the picked scope (``scope_site``/``scope_node``: global
    by default), and the site calls matching the filters, newest created first."""
    if scope_node and not scope_site:
        raise HTTPException(
            400, "scope_node: give scope_site too (a node is named within its site)"
        )
    if status and status not in STATUSES:
        raise HTTPException(400, f"status must be one of {', '.join(STATUSES)}")
    filters = queries.SiteCallFilter(
        site=site or None,
        node=node or None,
        status=status or None,
        channel=channel or None,
        target=target or None,
        created_from=form_stamp("from", created_from),
        created_to=form_stamp("to", created_to),
    )
    settings: Settings = api_state(request).settings
    with engine_of(request).connect() as conn:
        with refusing_bad_cursor():
            page = queries.list_site_calls(conn, filters, limit=PAGE_SIZE, after=after or None)
        context = kpi_context(conn, settings, site=scope_site or None, node=scope_node or None)
        scopes = _scopes(conn, settings)
    params = {
        "site": site,
        "node": node,
        "status": status,
        "channel": channel,
        "target": target,
        "from": created_from,
        "to": created_to,
        "scope_site": scope_site,
        "scope_node": scope_node,
    }
    return render(
        request,
        "site_calls.html",
        {
            **context,
            "calls": page.rows,
            "next_cursor": page.next_cursor,
            "after": after,
            "params": params,
            "statuses": STATUSES,
            "channels": CHANNELS,
            "scopes": scopes,
            "scope_site": scope_site,
            "scope_node": scope_node,
        },
    )


@router.get("/live/site-calls")
def live_kpi_tiles(
    request: Request, session: Viewer, scope_site: Text = "", scope_node: Text = ""
) -> Response:
    """The KPI tiles of a scope alone; the site-calls page polls them
    (docs/decisions.md "Live figures poll, and rest while the tab is hidden")."""
    if scope_node and not scope_site:
        raise HTTPException(400, "scope_node: give scope_site too")
    with engine_of(request).connect() as conn:
        context = kpi_tiles_context(
            conn, api_state(request).settings, site=scope_site or None, node=scope_node or None
        )
    scope = {"scope_site": scope_site, "scope_node": scope_node}
    return render(request, "_kpi_live.html", {**context, **scope})


# What a re-submission's redirect may say (``resubmitted`` names the packet).
RESUBMIT_TEXT = {
    "accepted": "Accepted: the packet was written and is no longer kept as rejected.",
    "rejected": "Rejected again: the packet is still kept; its reason below is the new one.",
    "missing": "Not found: no rejected packet has this id (re-submitted or purged already).",
    "busy": "Not written: the store did not answer in time; nothing changed, try again.",
}


@router.get("/site-calls/rejected")
def rejected_list(
    request: Request,
    session: Viewer,
    after: After = "",
    resubmitted: Annotated[str, Query(max_length=36)] = "",
    outcome: Annotated[str, Query(max_length=16)] = "",
    call: Annotated[str, Query(max_length=36)] = "",
) -> Response:
    """Telemetry packets the contract or the store refused, newest first, kept whole;
    after a re-submission (``resubmitted``, ``outcome``, ``call``) its outcome first,
    with the packet's current reason when it was rejected again."""
    with engine_of(request).connect() as conn:
        notice = _resubmission(conn, resubmitted, outcome, call)
    return render_rejected(request, after, notifications=False, resubmission=notice)


def render_rejected(
    request: Request, after: str, *, notifications: bool, resubmission: object = None
) -> Response:
    """The page of rejected telemetry, or of rejected notifications (``rejected.html``;
    no re-submission for those: they are no telemetry)."""
    with engine_of(request).connect() as conn, refusing_bad_cursor():
        page = queries.list_rejected_telemetry(
            conn, limit=PAGE_SIZE, after=after or None, notifications=notifications
        )
    packets = [
        {
            "id": row.id,
            "source": row.source,
            "reason": row.reason,
            "rejected_at_utc": row.rejected_at_utc,
            "packet": bytes(row.packet).decode("utf-8", "replace"),
            "packet_size": row.packet_size,
            "packet_truncated": row.packet_size > len(row.packet),
        }
        for row in page.rows
    ]
    return render(
        request,
        "rejected.html",
        {
            "packets": packets,
            "next_cursor": page.next_cursor,
            "after": after,
            "resubmission": resubmission,
            "notifications": notifications,
            "retention_days": api_state(request).settings.sitecalls.rejected_retention_days,
        },
    )


@router.get("/site-calls/rejected/{rejected_id}/packet")
def rejected_packet_download(request: Request, session: Viewer, rejected_id: uuid.UUID) -> Response:
    """The whole rejected packet as a download (as ``GET
    /api/site-calls/rejected/{id}/packet``); the list shows only its beginning."""
    with engine_of(request).connect() as conn:
        packet = queries.rejected_packet(conn, str(rejected_id))
    if packet is None:
        raise HTTPException(404, "no rejected packet has this id")
    return packet_download(packet, str(rejected_id))


@router.post("/site-calls/rejected/{rejected_id}/resubmit")
def resubmit_packet(request: Request, session: Actor, rejected_id: uuid.UUID) -> Response:
    """Write a rejected packet again (as ``POST /api/site-calls/rejected/{id}/resubmit``);
    redirects to the rejected list, which shows the outcome."""
    state = api_state(request)
    writer = make_writer(state.settings, state.engine, attempts=WRITE_ATTEMPTS)
    params = {"resubmitted": str(rejected_id)}
    try:
        result = resubmit_rejected(state.engine, writer, str(rejected_id), session.principal.name)
    except IngestBudgetExceeded:
        result, params["outcome"] = None, "busy"
    if result is None:
        params.setdefault("outcome", "missing")
    else:
        params["outcome"] = str(result.outcome).lower()
        if result.outcome is ResubmitOutcome.ACCEPTED and result.tracked_operation_id:
            params["call"] = result.tracked_operation_id
    return redirect(f"/site-calls/rejected?{urlencode(params)}")


def _resubmission(
    conn: sa.Connection, rejected_id: str, outcome: str, call: str
) -> dict[str, str] | None:
    """The outcome a re-submission's redirect names, read back: only known outcomes and
    ids (nothing of the query string is shown as it came)."""
    if outcome not in RESUBMIT_TEXT or not _is_uuid(rejected_id):
        return None
    notice = {"id": rejected_id, "outcome": outcome, "summary": RESUBMIT_TEXT[outcome]}
    if outcome == "accepted" and _is_uuid(call):
        notice["call"] = call
    if outcome == "rejected":
        reason = queries.rejected_reason(conn, rejected_id)
        if reason is not None:
            notice["reason"] = reason
    return notice


def _is_uuid(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


@router.get("/site-calls/{tracked_operation_id}")
def site_call_page(request: Request, session: Viewer, tracked_operation_id: uuid.UUID) -> Response:
    return _call_page(request, str(tracked_operation_id))


@router.get("/site-calls/{tracked_operation_id}/state")
def site_call_state(
    request: Request,
    session: Viewer,
    tracked_operation_id: uuid.UUID,
    since: Annotated[str, Query(max_length=40)] = "",
) -> Response:
    """The call's state, actions and audit events alone; htmx polls it until the call is
    terminal. ``since`` (ISO 8601): central's receipt time of the state shown when an
    operator's command was applied at the site; while the call still has it, Retry and
    Discard are not offered again."""
    return _call_page(request, str(tracked_operation_id), "_site_call_state.html", since)


@router.post("/site-calls/{tracked_operation_id}/retry")
async def retry_call(request: Request, session: Actor, tracked_operation_id: uuid.UUID) -> Response:
    """Relay Retry of a Parked call to its site; 303 to the call's page, which shows
    the outcome."""
    return await _relay(request, session, str(tracked_operation_id), Command.RETRY)


@router.post("/site-calls/{tracked_operation_id}/discard")
async def discard_call(
    request: Request, session: Actor, tracked_operation_id: uuid.UUID
) -> Response:
    """Relay Discard of a Parked call to its site; 303 to the call's page, which shows
    the outcome."""
    return await _relay(request, session, str(tracked_operation_id), Command.DISCARD)


# --- sites --------------------------------------------------------------------------------
@router.get("/sites")
def site_list(request: Request, session: Viewer) -> Response:
    """The configured sites and their reconciliation state (never a site's token)."""
    with engine_of(request).connect() as conn:
        states = site_states(conn, api_state(request).settings.sites)
    return render(request, "sites.html", {"sites": states})


# --- audit log ----------------------------------------------------------------------------
@router.get("/audit-log")
def audit_log_page(
    request: Request,
    session: Viewer,
    actor: Text = "",
    action: Text = "",
    outcome: Text = "",
    category: Text = "",
    target: Text = "",
    correlation_id: Text = "",
    occurred_from: Annotated[str, Query(alias="from", max_length=40)] = "",
    occurred_to: Annotated[str, Query(alias="to", max_length=40)] = "",
    after: After = "",
) -> Response:
    """Audit events matching the filters (all combine with AND), newest first, under the
    badge of the last ``controlroom audit verify``."""
    filters = queries.AuditFilter(
        actor=actor or None,
        action=action or None,
        outcome=outcome or None,
        category=category or None,
        target=target or None,
        correlation_id=correlation_id or None,
        occurred_from=form_stamp("from", occurred_from),
        occurred_to=form_stamp("to", occurred_to),
    )
    with engine_of(request).connect() as conn:
        with refusing_bad_cursor():
            page = queries.list_audit_events(conn, filters, limit=PAGE_SIZE, after=after or None)
        verification = last_verification(conn)
    params = {
        "actor": actor,
        "action": action,
        "outcome": outcome,
        "category": category,
        "target": target,
        "correlation_id": correlation_id,
        "from": occurred_from,
        "to": occurred_to,
    }
    return render(
        request,
        "audit_log.html",
        {
            "events": page.rows,
            "next_cursor": page.next_cursor,
            "after": after,
            "params": params,
            "verification": verification,
        },
    )


# --- helpers ------------------------------------------------------------------------------
def _call_page(
    request: Request,
    tracked_operation_id: str,
    template: str = "site_call.html",
    since: str = "",
) -> Response:
    settings: Settings = api_state(request).settings
    with engine_of(request).connect() as conn:
        call = queries.get_site_call(conn, tracked_operation_id)
        if call is None:
            raise HTTPException(
                404, f"no site call with tracked_operation_id {tracked_operation_id}"
            )
        events = queries.audit_events_of(conn, tracked_operation_id)
    return render(
        request,
        template,
        {
            "call": call,
            "events": events,
            "parked": call.status == SiteCallStatus.PARKED.value,
            "terminal": is_terminal(call.status),
            "since": since,
            "unrelayable": unrelayable_reason(settings, call.source_site),
        },
    )


async def _relay(
    request: Request, session: Session, tracked_operation_id: str, command: Command
) -> Response:
    """Relay ``command``, then 303 to the call's page with the outcome (post/redirect/
    get: a reload of that page sends nothing). An id central does not have goes to the
    list, saying so."""
    state = api_state(request)
    result = await relay_command(
        state.settings, state.engine, tracked_operation_id, command, session.principal.name
    )
    if result is None:
        text = (
            f"{command.title()}: central has no site call {tracked_operation_id} (it may "
            "have been purged); nothing was sent."
        )
        return redirect_with(request, "/site-calls", Flash("error", text, code="NotFound"))
    flash = Flash(
        "notice" if result.outcome is RelayOutcome.APPLIED else "error",
        f"{command.title()}: {OUTCOME_TEXT[result.outcome]}",
        code=str(result.outcome),
        detail=result.message,
    )
    return redirect_with(request, f"/site-calls/{tracked_operation_id}", flash)


def _scopes(conn: sa.Connection, settings: Settings) -> list[tuple[str, list[str]]]:
    """The picker's scopes: each site (configured, or with pending or recently finished
    calls) and its nodes with such calls, sorted."""
    now = datetime.now(UTC)
    report = measure_kpis(
        conn, now=now, interval=settings.kpi.interval, stuck_threshold=settings.kpi.stuck_threshold
    )
    nodes: dict[str, set[str]] = {site.id: set() for site in settings.sites}
    for site, node in report.by_node:
        found = nodes.setdefault(site, set())
        if node is not None:
            found.add(node)
    return [(site, sorted(found)) for site, found in sorted(nodes.items())]
