"""Failed imports: messages of the error queue kept whole because they could not be
ingested (docs/design.md "Failed imports"; docs/decisions.md "Failed imports are served
over the API").

- ``GET /api/failed-imports``: newest first, paged like ``/api/errors`` (``Total-Count``,
  ``ETag``, ``Link``); each item has ``id``, ``queue``, ``reason``, ``failed_at`` (UTC),
  ``headers`` (as kept: an object of strings, or the raw text when it is not one; bytes
  that were not UTF-8 written as ``\\xNN``) and ``body_size`` (bytes).
- ``POST /api/failed-imports/{id}/reimport``: put it back on the error queue (202
  ``{"outcome": "republished"}``); 404 when there is none, 422 when it cannot go back on
  a queue as it is (headers not an object of UTF-8 texts, or more than the broker takes),
  502 when the queue did not confirm it, 503 when this process has no transport; it is
  kept in each case.
- ``POST /api/failed-imports/reimport-all``: every one (202 with the counts, and
  ``kept``: ``[{"id", "reason"}]`` of those not re-imported); one that cannot go back or
  whose publish fails is kept and reported, the rest proceed.

Re-importing needs role ``operator`` (every state-changing route does; ``auth.py``).
"""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel, TypeAdapter

from controlroom.api.auth import current_principal
from controlroom.api.paging import LIST_RESPONSES, PagingParams, paged_response
from controlroom.api.views import UtcTimestamp
from controlroom.errors.ingest import reimport
from controlroom.errors.ingest.reimport import ReimportOutcome
from controlroom.runtime.wire_text import escape_wire_text
from controlroom.transport.base import Transport, TransportError

router = APIRouter(tags=["failed imports"])


class FailedImportView(BaseModel):
    id: str
    queue: str
    reason: str
    failed_at: UtcTimestamp
    headers: dict[str, str | None] | str
    body_size: int


class ReimportAnswer(BaseModel):
    outcome: str


class KeptImport(BaseModel):
    id: str
    reason: str


class ReimportAllAnswer(BaseModel):
    republished: int
    unreadable: int
    gone: int
    failed: int
    kept: list[KeptImport]


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
            headers=item.headers,
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
        422: {
            "description": "Its headers are not an object of strings, or the broker cannot "
            "carry it as it is: it cannot go back (it is kept)."
        },
        502: {"description": "The error queue did not confirm the publish (it is kept)."},
        503: {"description": "This process has no transport to publish with."},
    },
)
async def reimport_one(
    request: Request, failed_import_id: str = Path(alias="id", max_length=36)
) -> ReimportAnswer:
    """Put one failed import back on the error queue, to be ingested again."""
    try:
        outcome = await _reimport(request, failed_import_id)
    except ValueError as exc:  # the transport cannot carry it as it is (Transport.publish)
        raise HTTPException(
            422,
            f"failed import {failed_import_id} cannot go back on the error queue as it is: "
            f"{escape_wire_text(str(exc))}",
        ) from None
    except TransportError as exc:  # kept: the publish may have failed
        raise HTTPException(
            502, f"the error queue did not confirm failed import {failed_import_id}: {exc}"
        ) from None
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
    report = await reimport.reimport_many(
        _engine(request),
        _transport(request),
        reimport.list_failed_import_ids(_engine(request)),
        error_queue=request.app.state.settings.error_queue,
        by=current_principal(request).name,
    )
    return ReimportAllAnswer(
        republished=report.count(ReimportOutcome.REPUBLISHED),
        unreadable=report.count(ReimportOutcome.UNREADABLE),
        gone=report.count(ReimportOutcome.GONE),
        failed=report.count(ReimportOutcome.FAILED),
        kept=[KeptImport(id=i, reason=reason) for i, reason in report.kept],
    )


async def _reimport(request: Request, failed_import_id: str) -> ReimportOutcome:
    return await reimport.reimport_failed_import(
        _engine(request),
        _transport(request),
        failed_import_id,
        error_queue=request.app.state.settings.error_queue,
        by=current_principal(request).name,
    )


def _transport(request: Request) -> Transport:
    transport: Transport | None = request.app.state.transport
    if transport is None:
        raise HTTPException(503, "this process has no transport to publish with")
    return transport


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = request.app.state.engine
    return engine
