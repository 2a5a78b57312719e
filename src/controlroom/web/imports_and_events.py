"""The console's failed imports (the list with reasons, re-import one or all) and event
log (what happened, newest first) pages.

Source: docs/design.md "Failed imports" and "Event log"; docs/decisions.md "The console
calls the same functions as the API". Reads and re-imports call the same
functions as ``GET /api/failed-imports``, ``POST /api/failed-imports/...`` and
``GET /api/eventlogitems`` (``errors.ingest.reimport``, ``controlroom.events``); no SQL
here. Headers, reasons and descriptions are rendered as text.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import Response

from controlroom import events
from controlroom.errors.ingest import reimport
from controlroom.errors.ingest.reimport import ReimportOutcome
from controlroom.errors.retries.outcomes import with_failures_since
from controlroom.transport.base import Transport, TransportError
from controlroom.web.common import (
    EXTRA_NAV,
    actor,
    api_state,
    notice_count,
    redirect,
    redirect_with,
    render,
    viewer,
)
from controlroom.web.flash import Flash
from controlroom.web.session import Session

router = APIRouter(include_in_schema=False)
Viewer = Annotated[Session, Depends(viewer)]
Actor = Annotated[Session, Depends(actor)]
Page = Annotated[int, Query(ge=1, le=1_000_000)]
PAGE_SIZE = 50

EXTRA_NAV.extend([("Failed imports", "/failed-imports"), ("Event log", "/event-log")])

# Fixed texts only: nothing from the URL but counts is ever shown.
_NOTICES = {
    "republished": "Re-imported: the message is back on the error queue, to be ingested again.",
    "unreadable": "Not re-imported: its headers cannot go back on a queue.",
    "failed": "Not re-imported: the error queue or the store failed (see the log); it is kept.",
    "gone": "Not re-imported: that failed import no longer exists.",
    "all": "Re-imported {republished}; {unreadable} could not go back on a queue; {failed} "
    "failed (see the log) and are kept; {gone} were gone.",
}
_COUNTS = ("republished", "unreadable", "failed", "gone")


@router.get("/failed-imports")
def failed_import_list(request: Request, session: Viewer, page: Page = 1) -> Response:
    """Messages kept whole because they could not be ingested, newest first."""
    with _engine(request).connect() as conn:
        found = reimport.list_failed_imports(conn, offset=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE)
    items = [
        {
            "id": item.id,
            "queue": item.queue,
            "reason": item.reason,
            "failed_at": item.failed_at,
            "headers": _headers_text(item.headers),
            "body_size": item.body_size,
        }
        for item in found.items
    ]
    return render(
        request,
        "failed_imports.html",
        {
            "items": items,
            "total": found.total,
            "page": page,
            "pages": max(1, math.ceil(found.total / PAGE_SIZE)),
            "notice": _notice(request),
            "has_transport": api_state(request).transport is not None,
        },
    )


@router.post("/failed-imports/reimport-all")
async def reimport_all(request: Request, session: Actor) -> Response:
    """Put every failed import back on the error queue; the counts on the list."""
    state = api_state(request)
    try:
        transport = _transport(request)
        report = await reimport.reimport_many(
            state.engine,
            transport,
            reimport.list_failed_import_ids(state.engine),
            error_queue=state.settings.error_queue,
            by=session.principal.name,
        )
    except Unavailable as exc:
        return exc.redirect(request)
    counts = {outcome.value: report.count(outcome) for outcome in ReimportOutcome}
    return redirect(
        "/failed-imports?done=all&"
        + "&".join(f"{key}={value}" for key, value in sorted(counts.items()))
    )


@router.post("/failed-imports/{failed_import_id}/reimport")
async def reimport_one(request: Request, session: Actor, failed_import_id: str) -> Response:
    """Put one failed import back on the error queue."""
    if len(failed_import_id) > 36:
        raise HTTPException(400, "id: at most 36 characters")
    try:
        transport = _transport(request)
        outcome = await _reimport(api_state(request), transport, failed_import_id, session)
    except Unavailable as exc:
        return exc.redirect(request)
    return redirect(f"/failed-imports?done={outcome.name.lower()}")


@router.get("/event-log")
def event_log(request: Request, session: Viewer, page: Page = 1) -> Response:
    """What happened, newest first."""
    with _engine(request).connect() as conn:
        found = events.list_events(conn, offset=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE)
        shown = with_failures_since(conn, found.items)
    return render(
        request,
        "event_log.html",
        {
            "items": shown,
            "total": found.total,
            "page": page,
            "pages": max(1, math.ceil(found.total / PAGE_SIZE)),
        },
    )


async def _reimport(
    state: Any, transport: Transport, failed_import_id: str, session: Session
) -> ReimportOutcome:
    try:
        return await reimport.reimport_failed_import(
            state.engine,
            transport,
            failed_import_id,
            error_queue=state.settings.error_queue,
            by=session.principal.name,
        )
    except TransportError as exc:
        raise Unavailable(f"The error queue could not be reached: {exc}") from exc
    except ValueError as exc:  # the transport cannot carry it as it is (Transport.publish)
        raise Unavailable(
            f"It cannot go back on the error queue as it is, so it is kept: {exc}"
        ) from exc


class Unavailable(Exception):
    """Not re-imported: no transport, the error queue did not answer, or it cannot carry
    the message as it is."""

    def redirect(self, request: Request) -> Response:
        """303 to the list, which shows why once (post/redirect/get)."""
        flash = Flash("error", str(self), code="NotReimported")
        return redirect_with(request, "/failed-imports", flash)


def _transport(request: Request) -> Transport:
    transport: Transport | None = api_state(request).transport
    if transport is None:
        raise Unavailable("This process has no transport to publish with.")
    return transport


def _headers_text(headers: dict[str, str | None] | str) -> str:
    """The kept headers (already escaped), one ``name: value`` a line (the stored text
    when not an object)."""
    if isinstance(headers, str):
        return headers
    return "\n".join(f"{name}: {'' if text is None else text}" for name, text in headers.items())


def _notice(request: Request) -> str | None:
    done = request.query_params.get("done", "")
    template = _NOTICES.get(done)
    if template is None:
        return None
    counts = {key: notice_count(request.query_params.get(key, "0")) for key in _COUNTS}
    return template.format(**counts)


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = api_state(request).engine
    return engine
