"""ServiceControl's message views over failed messages, and full-text search.

Routes: ``GET /api/messages``, ``GET /api/endpoints/{endpoint}/messages``,
``GET /api/conversations/{conversationid}`` (``include_system_messages``, default false,
as ServiceControl), ``GET /api/messages/search/{keyword}``, ``GET /api/messages/search?q=``
and the same two below ``/api/endpoints/{endpoint}/``.

Search looks the text up in the provider's full-text index over headers and body text
(``controlroom.errors.read.search``): any of its words, as ServiceControl ORs them, a word
ending in ``*`` as a prefix; and as an exact message id or UniqueMessageId. Answers
are paged and sorted like ``/api/errors`` (``Total-Count``, ``ETag``, ``Link``; ``sort``
also ``processed_at``, the time of failure) and shaped as ServiceControl's message list
(``MessagesView``) so that its clients can open a message found by id: ``status`` is
one of ``failed``, ``repeatedFailure``, ``resolvedSuccessfully``, ``archivedFailure``,
``retryIssued``; ``processed_at`` is the time of failure; ``headers``
is a list of ``{"key", "value"}``; ``body_url`` is relative to the API root.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, TypeAdapter

from controlroom.api.paging import LIST_RESPONSES, PagingParams, exact_count_limit, paged_response
from controlroom.api.parameters import ordering
from controlroom.api.views import (
    EndpointDetails,
    UtcTimestamp,
    body_url,
    receiving_endpoint,
    sending_endpoint,
)
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.read.filters import EVERY_MESSAGE, FailedMessageFilter, Ordering
from controlroom.errors.read.lists import list_message_hits
from controlroom.errors.read.search import search_failed_messages
from controlroom.errors.read.summaries import SearchHit

MAX_SEARCH_LENGTH = 1000
"""Longest search text, in characters."""

FAILED_MESSAGE_TIMING = "00:00:00"
"""``processing_time``, ``critical_time`` and ``delivery_time`` of a failed message, as
ServiceControl answers them (a ``TimeSpan`` of zero): ServicePulse's sequence diagram
splits each one."""

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
    # ServiceControl's timings of a processed message: always "00:00:00" for a failed one.
    processing_time: str = FAILED_MESSAGE_TIMING
    critical_time: str = FAILED_MESSAGE_TIMING
    delivery_time: str = FAILED_MESSAGE_TIMING


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


def search_item(hit: SearchHit) -> MessageSearchItem:
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
    "Words to find in headers and body text, any of them (as ServiceControl); a dotted "
    "name is found whole or by a part; a word ending in * (3 characters or more before "
    "it) finds any word starting with it. Also an exact message id or failed-message id. "
    "No other search syntax."
)


def message_ordering(
    sort: Annotated[
        str | None,
        Query(
            max_length=200,
            description="processed_at (the time of failure), or a key of /api/errors; any "
            "other value sorts by time_sent.",
        ),
    ] = None,
    direction: Annotated[
        str | None, Query(max_length=200, description="asc or desc (any other value).")
    ] = None,
) -> Ordering:
    """``sort``/``direction`` of ServiceControl's message views (a FastAPI dependency)."""
    return ordering("time_of_failure" if sort == "processed_at" else sort, direction)


MessageOrdering = Annotated[Ordering, Depends(message_ordering)]
IncludeSystemMessages = Annotated[
    bool, Query(description="Include system (control) messages; ServiceControl's default: no.")
]
EndpointName = Annotated[
    str, Path(max_length=400, description="The receiving endpoint's name (exact).")
]


def _search(
    request: Request,
    text: str,
    page: PagingParams,
    order: Ordering,
    where: FailedMessageFilter = EVERY_MESSAGE,
) -> Response:
    with request.app.state.engine.connect() as conn:
        result = search_failed_messages(
            conn,
            text,
            offset=page.offset,
            limit=page.per_page,
            order=order,
            where=where,
            exact_count_limit=exact_count_limit(request),
            any_word=True,  # ServiceControl's keyword search ORs its words
        )
    items = [search_item(hit) for hit in result.items]
    return paged_response(
        request, items, _ADAPTER, page, result.total, estimated=result.total_estimated
    )


def _messages(
    request: Request,
    page: PagingParams,
    order: Ordering,
    where: FailedMessageFilter,
) -> Response:
    with request.app.state.engine.connect() as conn:
        result = list_message_hits(
            conn,
            offset=page.offset,
            limit=page.per_page,
            order=order,
            where=where,
            exact_count_limit=exact_count_limit(request),
        )
    items = [search_item(hit) for hit in result.items]
    return paged_response(
        request, items, _ADAPTER, page, result.total, estimated=result.total_estimated
    )


def _register(path: str, endpoint: Callable[..., Any]) -> None:
    for route_path, in_schema in ((path, True), (path + "/", False)):
        router.add_api_route(
            route_path,
            endpoint,
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
    order: MessageOrdering,
) -> Response:
    """Failed messages containing ``q``, paged and sorted like ``/api/errors``."""
    return _search(request, q, page, order)


def search_by_keyword(
    request: Request,
    keyword: Annotated[
        str, Path(min_length=1, max_length=MAX_SEARCH_LENGTH, description=_TEXT_DESCRIPTION)
    ],
    page: PagingParams,
    order: MessageOrdering,
) -> Response:
    """Failed messages containing ``keyword``, paged and sorted like ``/api/errors``."""
    return _search(request, keyword, page, order)


def endpoint_search_by_query(
    request: Request,
    endpoint: EndpointName,
    q: Annotated[
        str, Query(min_length=1, max_length=MAX_SEARCH_LENGTH, description=_TEXT_DESCRIPTION)
    ],
    page: PagingParams,
    order: MessageOrdering,
) -> Response:
    """Failed messages of the receiving ``endpoint`` containing ``q``."""
    where = FailedMessageFilter(receiving_endpoint=endpoint)
    return _search(request, q, page, order, where)


def endpoint_search_by_keyword(
    request: Request,
    endpoint: EndpointName,
    keyword: Annotated[
        str, Path(min_length=1, max_length=MAX_SEARCH_LENGTH, description=_TEXT_DESCRIPTION)
    ],
    page: PagingParams,
    order: MessageOrdering,
) -> Response:
    """Failed messages of the receiving ``endpoint`` containing ``keyword``."""
    where = FailedMessageFilter(receiving_endpoint=endpoint)
    return _search(request, keyword, page, order, where)


def list_messages(
    request: Request,
    page: PagingParams,
    order: MessageOrdering,
    include_system_messages: IncludeSystemMessages = False,
) -> Response:
    """Every failed message, in ServiceControl's message shape, paged and sorted."""
    where = FailedMessageFilter(include_system_messages=include_system_messages)
    return _messages(request, page, order, where)


def list_endpoint_messages(
    request: Request,
    endpoint: EndpointName,
    page: PagingParams,
    order: MessageOrdering,
    include_system_messages: IncludeSystemMessages = False,
) -> Response:
    """The failed messages of the receiving ``endpoint``, paged and sorted."""
    where = FailedMessageFilter(
        receiving_endpoint=endpoint, include_system_messages=include_system_messages
    )
    return _messages(request, page, order, where)


def list_conversation(
    request: Request,
    conversation_id: Annotated[
        str, Path(alias="conversationid", max_length=400, description="NServiceBus.ConversationId")
    ],
    page: PagingParams,
    order: MessageOrdering,
    include_system_messages: IncludeSystemMessages = False,
) -> Response:
    """The failed messages of one conversation (``NServiceBus.ConversationId``)."""
    where = FailedMessageFilter(
        conversation_id=conversation_id, include_system_messages=include_system_messages
    )
    return _messages(request, page, order, where)


_register("/messages", list_messages)
_register("/messages/search", search_by_query)
_register("/messages/search/{keyword}", search_by_keyword)
_register("/endpoints/{endpoint}/messages", list_endpoint_messages)
_register("/endpoints/{endpoint}/messages/search", endpoint_search_by_query)
_register("/endpoints/{endpoint}/messages/search/{keyword}", endpoint_search_by_keyword)
_register("/conversations/{conversationid}", list_conversation)
