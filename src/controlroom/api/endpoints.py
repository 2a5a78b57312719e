"""Known endpoints: list them, switch the user's ``monitored`` flag, forget one.

ServiceControl's routes and shapes: ``GET /api/endpoints`` (every endpoint instance
known from failures, ServiceControl's ``EndpointsView``; ``monitored`` and
``monitor_heartbeat`` are the user's flag, false until set; Controlroom receives no
heartbeats, so ``is_sending_heartbeats`` is false and there is no
``heartbeat_information``), ``GET /api/endpoints/known`` (paged like ``/api/errors``),
``PATCH /api/endpoints/{id}`` with ServiceControl's ``{"monitor_heartbeat": bool}`` (or
``{"monitoring_enabled": bool}``) answering 202, ``DELETE /api/endpoints/{id}`` (204;
role ``admin``), and ``GET /api/endpointssettings``.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Path, Request, Response
from pydantic import BaseModel, ConfigDict, TypeAdapter, model_validator

from controlroom.api.auth import current_principal, require_admin
from controlroom.api.paging import LIST_RESPONSES, PagingParams, paged_response
from controlroom.db.engine import begin_write
from controlroom.errors import actions
from controlroom.errors.read import endpoints

router = APIRouter(tags=["endpoints"])

EndpointId = Annotated[uuid.UUID, Path(alias="id", description="The known endpoint's id.")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "No known endpoint has this id."}
}


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


class EndpointView(BaseModel):
    """One endpoint instance as ``GET /api/endpoints`` shows it (ServiceControl's
    ``EndpointsView`` without ``heartbeat_information``: Controlroom has no heartbeats)."""

    id: str
    name: str
    host_display_name: str | None = None
    monitored: bool
    monitor_heartbeat: bool
    is_sending_heartbeats: bool = False


class EndpointUpdate(BaseModel):
    """``PATCH /api/endpoints/{id}``: the user's monitoring choice, under ServiceControl's
    name ``monitor_heartbeat`` or Controlroom's ``monitoring_enabled`` (exactly one)."""

    model_config = ConfigDict(extra="forbid")

    monitor_heartbeat: bool | None = None
    monitoring_enabled: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> EndpointUpdate:
        if (self.monitor_heartbeat is None) == (self.monitoring_enabled is None):
            raise ValueError("give exactly one of 'monitor_heartbeat' and 'monitoring_enabled'")
        return self

    @property
    def monitored(self) -> bool:
        chosen = self.monitor_heartbeat
        return chosen if chosen is not None else bool(self.monitoring_enabled)


class EndpointSettingsView(BaseModel):
    """ServiceControl's ``SettingsData``: whether instances of ``name`` are tracked; the
    entry named ``""`` is the default for every endpoint."""

    name: str
    track_instances: bool


@router.get("/endpoints", response_model_exclude_none=True)
def list_endpoints(request: Request, response: Response) -> list[EndpointView]:
    """Every endpoint instance seen on failed messages, by name then host, with the
    user's monitoring flag; ``Total-Count`` is their number."""
    with _engine(request).connect() as conn:
        rows = endpoints.all_known_endpoints(conn)
    response.headers["Total-Count"] = str(len(rows))
    return [
        EndpointView(
            id=row.id,
            name=row.name,
            host_display_name=row.host,
            monitored=row.monitored,
            monitor_heartbeat=row.monitored,
        )
        for row in rows
    ]


@router.get("/endpointssettings")
def list_endpoint_settings() -> list[EndpointSettingsView]:
    """ServiceControl's endpoint settings: Controlroom keeps none per endpoint, so this
    is ServiceControl's answer for that case, the default entry (instances tracked)."""
    return [EndpointSettingsView(name="", track_instances=True)]


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
    found = actions.set_endpoint_monitored(
        _engine(request), str(endpoint_id), update.monitored, by=current_principal(request).name
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
