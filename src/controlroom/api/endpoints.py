"""Known endpoints: list them, switch the user's ``monitored`` flag, forget one.

ServiceControl's routes and shapes: ``GET /api/endpoints/known`` (paged like
``/api/errors``), ``PATCH /api/endpoints/{id}`` with ``{"monitoring_enabled": bool}``
(202), ``DELETE /api/endpoints/{id}`` (204; role ``admin``). ``GET /api/endpoints``
(ServiceControl's heartbeat-monitored endpoints) answers ``[]`` with ``Total-Count: 0``:
Controlroom has no heartbeats, and an empty list keeps existing clients working.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Path, Request, Response
from pydantic import BaseModel, ConfigDict, TypeAdapter

from controlroom.api.auth import current_principal, require_admin
from controlroom.api.errors import LIST_RESPONSES, PagingParams, paged_response
from controlroom.db.engine import begin_write
from controlroom.errors import activity
from controlroom.errors.ingest.writer import utc_now
from controlroom.errors.read import endpoints

router = APIRouter(tags=["endpoints"])

EndpointId = Annotated[uuid.UUID, Path(alias="id", description="The known endpoint's id.")]
NOT_FOUND = {404: {"description": "No known endpoint has this id."}}


class EndpointDetails(BaseModel):
    name: str
    host_id: str
    host: str | None = None


class KnownEndpointView(BaseModel):
    """One endpoint instance (ServiceControl's ``KnownEndpointsView``, plus ``monitored``)."""

    id: str
    endpoint_details: EndpointDetails
    host_display_name: str | None = None
    monitored: bool


class EndpointUpdate(BaseModel):
    """``PATCH /api/endpoints/{id}``: the user's monitoring choice."""

    model_config = ConfigDict(extra="forbid")

    monitoring_enabled: bool


@router.get("/endpoints")
def list_monitored_endpoints(response: Response) -> list[dict[str, Any]]:
    """Heartbeat-monitored endpoints: always empty (Controlroom has no heartbeats)."""
    response.headers["Total-Count"] = "0"
    return []


@router.get("/endpoints/known", response_model=list[KnownEndpointView], responses=LIST_RESPONSES)
def list_known_endpoints(request: Request, page: PagingParams) -> Response:
    """Endpoint instances seen on failed messages, by name then host, paged like
    ``/api/errors`` (``Total-Count``, ``ETag``, ``Link``)."""
    with _engine(request).connect() as conn:
        result = endpoints.list_known_endpoints(conn, offset=page.offset, limit=page.per_page)
    items = [_view(row) for row in result.items]
    return paged_response(request, items, _LIST_ADAPTER, page, result.total)


@router.patch("/endpoints/{id}", status_code=202, response_class=Response, responses=NOT_FOUND)
def update_endpoint(request: Request, endpoint_id: EndpointId, update: EndpointUpdate) -> Response:
    """Set whether the endpoint is monitored. Ingestion never changes it back."""
    with begin_write(_engine(request)) as conn:
        found = endpoints.set_monitored(conn, str(endpoint_id), update.monitoring_enabled)
        if found:
            activity.endpoint_monitoring_changed(
                conn,
                str(endpoint_id),
                update.monitoring_enabled,
                by=current_principal(request).name,
                now=utc_now(),
            )
    if not found:
        raise HTTPException(404, f"no known endpoint with id {endpoint_id}")
    return Response(status_code=202)


@router.delete(
    "/endpoints/{id}",
    status_code=204,
    response_class=Response,
    responses={**NOT_FOUND, 403: {"description": "Only role admin may delete an endpoint."}},
    dependencies=[Depends(require_admin)],
)
def delete_endpoint(request: Request, endpoint_id: EndpointId) -> Response:
    """Forget the endpoint (its failed messages stay). Role ``admin``."""
    with begin_write(_engine(request)) as conn:
        found = endpoints.delete_known_endpoint(conn, str(endpoint_id))
    if not found:
        raise HTTPException(404, f"no known endpoint with id {endpoint_id}")
    return Response(status_code=204)


_LIST_ADAPTER = TypeAdapter(list[KnownEndpointView])


def _view(row: endpoints.KnownEndpointRow) -> KnownEndpointView:
    return KnownEndpointView(
        id=row.id,
        endpoint_details=EndpointDetails(name=row.name, host_id=row.host_id, host=row.host),
        host_display_name=row.host,
        monitored=row.monitored,
    )


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = request.app.state.engine
    return engine
