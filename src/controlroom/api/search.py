"""Full-text search of failed messages: ``GET /api/messages/search/{keyword}`` and
``GET /api/messages/search?q=``.

The text is looked up in the provider's full-text index over headers and body text
(``controlroom.errors.search``), and as an exact message id or UniqueMessageId. Answers
are paged and sorted like ``/api/errors`` (``Total-Count``, ``ETag``, ``Link``) and shaped
as ServiceControl's message list (``MessagesView``) so that its clients can open a message
found by id: ``status`` is one of ``failed``, ``repeatedFailure``, ``resolvedSuccessfully``,
``archivedFailure``, ``retryIssued``; ``processed_at`` is the time of failure; ``headers``
is a list of ``{"key", "value"}``; ``body_url`` is relative to the API root.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, TypeAdapter

from controlroom.api.errors import (
    LIST_RESPONSES,
    EndpointDetails,
    OrderingParams,
    PagingParams,
    UtcTimestamp,
    body_url,
    paged_response,
    receiving_endpoint,
    sending_endpoint,
)
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.read import queries

MAX_SEARCH_LENGTH = 1000
"""Longest search text, in characters."""

router = APIRouter(tags=["search"])

MessageStatus = Literal[
    "failed", "repeatedFailure", "resolvedSuccessfully", "archivedFailure", "retryIssued"
]


class Header(BaseModel):
    key: str
    value: str | None = None


class MessageSearchItem(BaseModel):
    """A failed message found by search (ServiceControl's ``MessagesView``).

    ``id`` is the failed message's id (UniqueMessageId); ``body_size`` is in bytes.
    """

    id: str
    message_id: str
    message_type: str | None = None
    conversation_id: str | None = None
    is_system_message: bool
    status: MessageStatus
    processed_at: UtcTimestamp
    time_sent: UtcTimestamp | None = None
    sending_endpoint: EndpointDetails | None = None
    receiving_endpoint: EndpointDetails
    body_url: str
    body_size: int
    headers: list[Header]


def message_status(status: FailedMessageStatus, attempts: int) -> MessageStatus:
    """ServiceControl's message status of a failed message: an unresolved one is
    ``failed`` after one attempt and ``repeatedFailure`` after more."""
    if status is FailedMessageStatus.ARCHIVED:
        return "archivedFailure"
    if status is FailedMessageStatus.RESOLVED:
        return "resolvedSuccessfully"
    if status is FailedMessageStatus.RETRY_ISSUED:
        return "retryIssued"
    return "failed" if attempts <= 1 else "repeatedFailure"


def search_item(hit: queries.SearchHit) -> MessageSearchItem:
    """The search-result shape of a stored failed message."""
    summary = hit.summary
    headers = json.loads(hit.headers_json)
    return MessageSearchItem(
        id=summary.id,
        message_id=summary.message_id,
        message_type=summary.message_type,
        conversation_id=hit.conversation_id,
        is_system_message=summary.is_system_message,
        status=message_status(summary.status, summary.number_of_processing_attempts),
        processed_at=summary.last_failure_at,
        time_sent=summary.time_sent,
        sending_endpoint=sending_endpoint(summary),
        receiving_endpoint=receiving_endpoint(summary),
        body_url=body_url(summary.id),
        body_size=hit.body_size,
        headers=[Header(key=key, value=value) for key, value in headers.items()],
    )


_ADAPTER = TypeAdapter(list[MessageSearchItem])
_TEXT_DESCRIPTION = (
    "Words to find in headers and body text, all of them; a dotted name is found whole "
    "or by a part. Also an exact message id or failed-message id. Read literally: no "
    "search syntax."
)


def _search(request: Request, text: str, page: PagingParams, order: queries.Ordering) -> Response:
    with request.app.state.engine.connect() as conn:
        result = queries.search_failed_messages(
            conn, text, offset=page.offset, limit=page.per_page, order=order
        )
    items = [search_item(hit) for hit in result.items]
    return paged_response(request, items, _ADAPTER, page, result.total)


def _register(path: str, endpoint: object) -> None:
    for route_path, in_schema in ((path, True), (path + "/", False)):
        router.add_api_route(
            route_path,
            endpoint,  # type: ignore[arg-type]
            methods=["GET"],
            response_model=list[MessageSearchItem],
            responses=LIST_RESPONSES,
            include_in_schema=in_schema,
        )


def search_by_query(
    request: Request,
    q: Annotated[
        str, Query(min_length=1, max_length=MAX_SEARCH_LENGTH, description=_TEXT_DESCRIPTION)
    ],
    page: PagingParams,
    order: OrderingParams,
) -> Response:
    """Failed messages containing ``q``, paged and sorted like ``/api/errors``."""
    return _search(request, q, page, order)


def search_by_keyword(
    request: Request,
    keyword: Annotated[
        str, Path(min_length=1, max_length=MAX_SEARCH_LENGTH, description=_TEXT_DESCRIPTION)
    ],
    page: PagingParams,
    order: OrderingParams,
) -> Response:
    """Failed messages containing ``keyword``, paged and sorted like ``/api/errors``."""
    return _search(request, keyword, page, order)


_register("/messages/search", search_by_query)
_register("/messages/search/{keyword}", search_by_keyword)
