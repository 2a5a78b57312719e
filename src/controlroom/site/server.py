"""The agent's HTTP API: the pull contract, the operator commands, and cached HTTP calls.

Source: docs/design.md "Reconciliation" (the pull contract) and "Retry/Discard relay". Routes (all
under ``/site``, all needing ``Authorization: Bearer <token>`` when the agent has a token):

- ``GET /site/tracking/changes?since=&after_id=&limit=``: ``{"rows": [...],
  "more_available": bool}``; rows in the telemetry contract's shape (no audit event),
  ordered by ``(updated_at_utc, tracked_operation_id)``, strictly after the pair, or at or
  after ``since`` when ``after_id`` is absent. ``limit`` 1..5000, default 500. Stamps
  to 100 ns (``telemetry.stamps``): rows carry seven fractional digits, and ``since``
  takes up to seven.
- ``POST /site/tracking/{id}/retry`` and ``/discard`` with ``{"operator": "name"}``:
  200 ``{"outcome": "Applied"}``, 409 ``{"outcome": "NotParked", "status": ...}``, 404
  ``{"outcome": "NotFound"}``; 422 naming ``operator`` when central's contract would
  refuse it as an audit actor (the command is then not applied).
- ``POST /site/calls`` with ``{"method", "url", "json"?, "target"?}``: a cached HTTP call
  made by the agent for a process that is not Python; 200 with the call's id and status,
  422 with them when it failed permanently. A ``target`` (or, without one, a ``url``)
  central's contract would refuse is a 422 naming it, before any call is made.
- ``POST /site/notifications`` with ``{"target", "subject", "body"?, "channel"?
  ("Email"|"Webhook"), "severity"? ("Info"|"Warning"|"Error"|"Critical"),
  "notification_id"?}`` (``telemetry.notification``), or ``"recipients"`` (a list of
  plain addresses, e-mail only) instead of ``"target"``: 201 ``{"notification_id",
  "status": "Pending"}`` once it is committed to the store; forwarded to central, which
  delivers it. 422 naming the field for a ``target`` or ``subject`` over 256 characters
  (never truncated), or an address that is not one plain address. The same
  ``notification_id`` again answers 200 with the stored status.
- ``GET /site/notifications?status=&limit=``: newest first, each with its ``status``
  (``Pending``, ``Forwarded``, ``Rejected``) and, when central refused it for good,
  ``rejected_reason``; ``GET /site/notifications/{id}``: one, 404 when unknown.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from controlroom.site.agent import CachedCallFailed, SiteAgent
from controlroom.site.lifecycle import CommandOutcome
from controlroom.site.store import NotificationStatus
from controlroom.site.telemetry import state_document
from controlroom.telemetry.contract import AuditActor, CallTarget, StorableText
from controlroom.telemetry.notification import SiteNotification
from controlroom.telemetry.stamps import Stamp, round_trip
from controlroom.telemetry.widths import TARGET_WIDTH
from controlroom.validation_answers import install_validation_answer

MAX_PAGE = 5000


def _authorize(request: Request) -> None:
    token = request.app.state.token
    if token is None:
        return
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        presented.strip().encode(), token.encode()
    ):
        raise HTTPException(
            401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"}
        )


class Command(BaseModel):
    """An operator's command. ``operator`` becomes the audit event's actor, so it follows
    central's contract (``telemetry.contract``): what central would refuse is never applied
    here, where its audit record would then be lost."""

    model_config = ConfigDict(extra="forbid")

    operator: AuditActor = Field(description="Who asked (audit actor).")


class HttpCall(BaseModel):
    """A cached HTTP call; its ``target`` (the ``url`` when absent) follows central's
    contract, like ``Command``."""

    model_config = ConfigDict(extra="forbid")

    method: str = Field("POST", pattern=r"^[A-Z]{3,7}$")
    url: StorableText = Field(pattern=r"^https?://")
    json_body: Any = Field(None, alias="json")
    target: CallTarget | None = None

    @model_validator(mode="after")
    def _url_as_target(self) -> HttpCall:
        if self.target is None and len(self.url) > TARGET_WIDTH:
            raise ValueError(
                f"url: it is the call's target when no target is given, so at most "
                f"{TARGET_WIDTH} characters"
            )
        return self


def create_site_app(agent: SiteAgent) -> FastAPI:
    """The agent's API over ``agent`` (module doc)."""
    app = FastAPI(title="Controlroom site agent", dependencies=[Depends(_authorize)])
    token = agent.settings.token
    app.state.token = token.get_secret_value() if token is not None else None
    install_validation_answer(app)

    @app.get("/site/tracking/changes")
    def changes(
        since: Annotated[Stamp | None, Query()] = None,
        after_id: Annotated[str | None, Query(min_length=1, max_length=36)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 500,
    ) -> dict[str, Any]:
        if after_id is not None and since is None:
            raise HTTPException(400, "after_id needs since (the cursor is the pair)")
        rows, more = agent.store.changes(since, after_id, limit)
        return {"rows": [state_document(row) for row in rows], "more_available": more}

    @app.post("/site/tracking/{tracked_operation_id}/retry")
    def retry(tracked_operation_id: str, command: Command) -> JSONResponse:
        outcome = agent.retry(tracked_operation_id, command.operator)
        return _answer(agent, tracked_operation_id, outcome)

    @app.post("/site/tracking/{tracked_operation_id}/discard")
    def discard(tracked_operation_id: str, command: Command) -> JSONResponse:
        outcome = agent.discard(tracked_operation_id, command.operator)
        return _answer(agent, tracked_operation_id, outcome)

    @app.post("/site/calls")
    def call(request: HttpCall) -> JSONResponse:
        try:
            result = agent.http_call(
                request.method, request.url, json=request.json_body, target=request.target
            )
        except CachedCallFailed as failed:
            return JSONResponse(
                {
                    "tracked_operation_id": failed.state.tracked_operation_id,
                    "status": str(failed.state.status),
                    "last_error": failed.state.last_error,
                },
                422,
            )
        return JSONResponse(
            {"tracked_operation_id": result.tracked_operation_id, "status": str(result.status)}
        )

    @app.post("/site/notifications", status_code=201)
    def notify(notification: SiteNotification) -> JSONResponse:
        given = notification.notification_id
        existing = agent.store.notification(given) if given is not None else None
        notification_id = agent.store_notification(notification)
        if existing is not None:
            return JSONResponse({"notification_id": notification_id, "status": existing["status"]})
        return JSONResponse(
            {"notification_id": notification_id, "status": str(NotificationStatus.PENDING)}, 201
        )

    @app.get("/site/notifications")
    def notifications(
        status: Annotated[NotificationStatus | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 500,
    ) -> dict[str, Any]:
        rows = agent.store.notifications(status, limit)
        return {"items": [_notification_view(row) for row in rows]}

    @app.get("/site/notifications/{notification_id}")
    def notification(notification_id: str) -> dict[str, Any]:
        row = agent.store.notification(notification_id)
        if row is None:
            raise HTTPException(404, "notification not found")
        return _notification_view(row)

    return app


def _notification_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        **row,
        "created_at_utc": round_trip(row["created_at_utc"]),
        "updated_at_utc": round_trip(row["updated_at_utc"]),
    }


_CODES = {
    CommandOutcome.APPLIED: 200,
    CommandOutcome.NOT_PARKED: 409,
    CommandOutcome.NOT_FOUND: 404,
}


def _answer(agent: SiteAgent, tracked_operation_id: str, outcome: CommandOutcome) -> JSONResponse:
    body: dict[str, Any] = {"outcome": str(outcome)}
    if outcome is CommandOutcome.NOT_PARKED:
        state = agent.store.state(tracked_operation_id)
        body["status"] = str(state.status) if state is not None else None
    return JSONResponse(body, _CODES[outcome])
