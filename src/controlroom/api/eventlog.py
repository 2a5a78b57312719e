"""The event log: ``GET /api/eventlogitems`` in ServiceControl's shape.

Each item: ``id``, ``description``, ``severity`` (``info``, ``warning``, ``error``,
``critical``), ``raised_at`` (UTC), ``related_to`` (paths such as ``/message/<id>``),
``category``, ``event_type``; newest first, paged like ``/api/errors`` (``page``,
``per_page``, ``Total-Count``, ``ETag``, ``Link``). Source: ServiceControl's
``EventLogApiModule``; the items are written by ``controlroom.events``. A completed
retry's description says, once known, how many of its messages have failed again since
(``errors/retries/outcomes``).
"""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, TypeAdapter

from controlroom import events
from controlroom.api.paging import LIST_RESPONSES, PagingParams, paged_response
from controlroom.api.views import UtcTimestamp
from controlroom.errors.retries import outcomes

router = APIRouter(tags=["event log"])


class EventLogItemView(BaseModel):
    id: str
    description: str
    severity: str
    raised_at: UtcTimestamp
    related_to: list[str]
    category: str
    event_type: str


_LIST_ADAPTER = TypeAdapter(list[EventLogItemView])


@router.get("/eventlogitems", response_model=list[EventLogItemView], responses=LIST_RESPONSES)
@router.get(
    "/eventlogitems/",
    response_model=list[EventLogItemView],
    responses=LIST_RESPONSES,
    include_in_schema=False,
)
def list_event_log_items(request: Request, page: PagingParams) -> Response:
    """What happened, newest first: retries, archives, comments, failed imports, sweeps."""
    engine: sa.Engine = request.app.state.engine
    with engine.connect() as conn:
        result = events.list_events(conn, offset=page.offset, limit=page.per_page)
        shown = outcomes.with_failures_since(conn, result.items)
    items = [
        EventLogItemView(
            id=item.id,
            description=item.description,
            severity=str(item.severity),
            raised_at=item.raised_at,
            related_to=list(item.related_to),
            category=item.category,
            event_type=item.event_type,
        )
        for item in shown
    ]
    return paged_response(request, items, _LIST_ADAPTER, page, result.total)
