"""Failed imports: messages of the error queue kept whole because they could not be
ingested (docs/design.md "Failed imports"; docs/decisions.md "Failed imports are served
over the API").

- ``GET /api/failed-imports``: newest first, paged like ``/api/errors`` (``Total-Count``,
  ``ETag``, ``Link``); each item has ``id``, ``queue``, ``reason``, ``failed_at`` (UTC),
  ``headers`` (as kept: an object of strings, or the raw text when it is not one) and
  ``body_size`` (bytes).
- ``POST /api/failed-imports/{id}/reimport``: put it back on the error queue (202
  ``{"outcome": "republished"}``); 404 when there is none, 422 when its headers cannot go
  back on a queue, 503 when this process has no transport.
- ``POST /api/failed-imports/reimport-all``: every one (202 with the counts).

Re-importing needs role ``operator`` (every state-changing route does; ``auth.py``).
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel, TypeAdapter

from controlroom.api.auth import current_principal
from controlroom.api.paging import LIST_RESPONSES, PagingParams, paged_response
from controlroom.api.views import UtcTimestamp
from controlroom.errors.ingest import reimport
from controlroom.errors.ingest.reimport import ReimportOutcome
from controlroom.transport.base import Transport

router = APIRouter(tags=["failed imports"])


class FailedImportView(BaseModel):
    id: str
    queue: str
    reason: str
    failed_at: UtcTimestamp
    headers: dict[str, Any] | str
    body_size: int


class ReimportAnswer(BaseModel):
    outcome: str


class ReimportAllAnswer(BaseModel):
    republished: int
    unreadable: int
    gone: int


_LIST_ADAPTER = TypeAdapter(list[FailedImportView])


@router.get("/failed-imports", response_model=list[FailedImportView], responses=LIST_RESPONSES)
def list_failed_imports(request: Request, page: PagingParams) -> Response:
    """Messages kept as failed imports, newest first, with the reason and the time."""
    with _engine(request).connect() as conn:
        result = reimport.list_failed_imports(conn, offset=page.offset, limit=page.per_page)
    items = [
        FailedImportView(
            id=item.id,
            queue=item.queue,
            reason=item.reason,
            failed_at=item.failed_at,
            headers=_headers(item.headers_json),
            body_size=item.body_size,
        )
        for item in result.items
    ]
    return paged_response(request, items, _LIST_ADAPTER, page, result.total)


@router.post(
    "/failed-imports/{id}/reimport",
    status_code=202,
    responses={
        404: {"description": "No failed import has this id."},
        422: {"description": "Its headers are not an object of strings: it cannot go back."},
        503: {"description": "This process has no transport to publish with."},
    },
)
async def reimport_one(
    request: Request, failed_import_id: str = Path(alias="id", max_length=36)
) -> ReimportAnswer:
    """Put one failed import back on the error queue, to be ingested again."""
    outcome = await _reimport(request, failed_import_id)
    if outcome is ReimportOutcome.GONE:
        raise HTTPException(404, f"no failed import with id {failed_import_id}")
    if outcome is ReimportOutcome.UNREADABLE:
        raise HTTPException(
            422, f"failed import {failed_import_id} has headers that cannot go back on a queue"
        )
    return ReimportAnswer(outcome=outcome.value)


@router.post(
    "/failed-imports/reimport-all",
    status_code=202,
    responses={503: {"description": "This process has no transport to publish with."}},
)
async def reimport_all(request: Request) -> ReimportAllAnswer:
    """Put every failed import back on the error queue."""
    _transport(request)
    ids = reimport.list_failed_import_ids(_engine(request))
    outcomes = [await _reimport(request, failed_import_id) for failed_import_id in ids]
    return ReimportAllAnswer(
        republished=outcomes.count(ReimportOutcome.REPUBLISHED),
        unreadable=outcomes.count(ReimportOutcome.UNREADABLE),
        gone=outcomes.count(ReimportOutcome.GONE),
    )


async def _reimport(request: Request, failed_import_id: str) -> ReimportOutcome:
    return await reimport.reimport_failed_import(
        _engine(request),
        _transport(request),
        failed_import_id,
        error_queue=request.app.state.settings.error_queue,
        by=current_principal(request).name,
    )


def _headers(headers_json: str) -> dict[str, Any] | str:
    try:
        value = json.loads(headers_json)
    except ValueError:
        return headers_json
    return value if isinstance(value, dict) else headers_json


def _transport(request: Request) -> Transport:
    transport: Transport | None = request.app.state.transport
    if transport is None:
        raise HTTPException(503, "this process has no transport to publish with")
    return transport


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = request.app.state.engine
    return engine
