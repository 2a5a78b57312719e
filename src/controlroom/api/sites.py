"""Sites and the relay: ``GET /api/sites``, ``POST /api/sites/{id}/reconcile``,
``POST /api/site-calls/{id}/retry`` and ``/discard`` (docs/design.md "Reconciliation",
"Retry/Discard relay").

- ``GET /api/sites``: each configured site (id, base URL; never its token) with its
  reconciliation state: last pull, last success, cursor, pinned, last error, reachable;
  times in the site-call API's format (``telemetry.stamps``: the cursor's to 100 ns).
- ``POST /api/sites/{id}/reconcile`` (operator): 202 when a pass of that site started,
  409 when a pass is already running, in this process or in another one of the
  deployment (every pass holds the pass lease), 404 for an unknown site.
- ``POST /api/site-calls/{id}/retry|discard`` (operator): the relay's outcome as
  ``{"outcome", "message"}``: Applied 200, NotParked 409, SiteUnreachable 503,
  OperationFailed 502; 404 "site call not found" for an id central does not have.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Path, Request
from fastapi.responses import JSONResponse

from controlroom.api.auth import current_principal
from controlroom.api.parameters import refuse_unknown_or_repeated
from controlroom.sitecalls.reconciliation import PassStart, ReconciliationService, site_states
from controlroom.sitecalls.relay import Command, RelayOutcome, relay_command
from controlroom.telemetry.stamps import Stamp

router = APIRouter(tags=["sites"], dependencies=[Depends(refuse_unknown_or_repeated)])

_BUSY = {
    PassStart.RUNNING_HERE: "a reconciliation pass is running in this process; ask again when "
    "it ends",
    PassStart.RUNNING_ELSEWHERE: "a reconciliation pass is running in another central process "
    "of this deployment (it holds the reconciliation lease); ask again when it ends",
}

_STATUS = {
    RelayOutcome.APPLIED: 200,
    RelayOutcome.NOT_PARKED: 409,
    RelayOutcome.SITE_UNREACHABLE: 503,
    RelayOutcome.OPERATION_FAILED: 502,
}


def _iso(value: datetime | Stamp | None) -> str | None:
    """The site-call API's one time format (``Stamp.isoformat``: UTC, seven digits)."""
    if value is None:
        return None
    return (value if isinstance(value, Stamp) else Stamp.of(value)).isoformat()


@router.get("/sites")
def list_sites(request: Request) -> list[dict[str, Any]]:
    """The configured sites and their reconciliation state."""
    engine: sa.Engine = request.app.state.engine
    with engine.connect() as conn:
        states = site_states(conn, request.app.state.settings.sites)
    return [
        {
            "id": state.id,
            "base_url": state.base_url,
            "last_pull_at_utc": _iso(state.last_pull_at_utc),
            "last_success_at_utc": _iso(state.last_success_at_utc),
            "cursor": None
            if state.cursor is None
            else {
                "updated_at_utc": _iso(state.cursor[0]),
                "tracked_operation_id": state.cursor[1],
            },
            "pinned": state.pinned,
            "pinned_changed_at_utc": _iso(state.pinned_changed_at_utc),
            "last_error": state.last_error,
            "reachable": state.reachable,
            "rows_pulled": state.rows_pulled,
        }
        for state in states
    ]


@router.post(
    "/sites/{site_id}/reconcile",
    status_code=202,
    responses={409: {"description": "A pass runs, here or in another central process."}},
)
def reconcile_site(site_id: str, request: Request) -> dict[str, Any]:
    """Start a reconciliation pass of one site, off the request path."""
    service: ReconciliationService = request.app.state.reconciliation
    site = service.site(site_id)
    if site is None:
        raise HTTPException(404, f"site {site_id!r} is not configured")
    start = service.trigger([site])
    if start is not PassStart.STARTED:
        raise HTTPException(409, _BUSY[start])
    return {"started": True, "site": site_id}


TrackedOperationId = Annotated[
    uuid.UUID, Path(description="The call's tracked_operation_id (a GUID, in any case).")
]


async def _relay(
    tracked_operation_id: uuid.UUID, command: Command, request: Request
) -> JSONResponse:
    result = await relay_command(
        request.app.state.settings,
        request.app.state.engine,
        str(tracked_operation_id),
        command,
        current_principal(request).name,
    )
    if result is None:
        raise HTTPException(404, "site call not found")
    return JSONResponse(
        {"outcome": str(result.outcome), "message": result.message}, _STATUS[result.outcome]
    )


@router.post("/site-calls/{tracked_operation_id}/retry")
async def retry_site_call(
    tracked_operation_id: TrackedOperationId, request: Request
) -> JSONResponse:
    """Relay an operator's Retry of a Parked call to its site."""
    return await _relay(tracked_operation_id, Command.RETRY, request)


@router.post("/site-calls/{tracked_operation_id}/discard")
async def discard_site_call(
    tracked_operation_id: TrackedOperationId, request: Request
) -> JSONResponse:
    """Relay an operator's Discard of a Parked call to its site."""
    return await _relay(tracked_operation_id, Command.DISCARD, request)
