"""The failed-message read API, in ServiceControl's shapes (``controlroom.api.views``).

Routes (each also answers with a trailing slash, as ServiceControl's clients sometimes
send it): ``GET|HEAD /api/errors``, ``GET /api/endpoints/{endpointname}/errors``,
``GET /api/errors/summary`` (ServiceControl's facets), ``GET /api/errors/counts``
(counts per status), ``GET /api/errors/queues/addresses``,
``GET /api/errors/last/{id}``, ``GET /api/errors/{id}`` and ``GET /api/messages/{id}/body``.

Lists page as ServiceControl pages (``controlroom.api.paging``); the query parameters
are read with its leniency (``controlroom.api.parameters``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Annotated, Any, TypeVar

import sqlalchemy as sa
from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import TypeAdapter

from controlroom.api.paging import (
    LIST_RESPONSES,
    Paging,
    PagingParams,
    exact_count_limit,
    paged_response,
)
from controlroom.api.parameters import FailedMessageId, FilterParams, OrderingParams, no_nul
from controlroom.api.views import (
    ErrorsFacets,
    ErrorsSummary,
    Facet,
    FacetValue,
    FailedMessageDetail,
    FailedMessageLastView,
    FailedMessageListItem,
    QueueAddress,
    detail,
    json_response,
    list_fields,
    list_item,
)
from controlroom.errors.ingest.headers import content_encoding, task_queue
from controlroom.errors.read.counts import count_by_status
from controlroom.errors.read.facets import unresolved_facets
from controlroom.errors.read.filter_text import STATUS_NAMES
from controlroom.errors.read.filters import FailedMessageFilter, Ordering
from controlroom.errors.read.lists import list_failed_messages, list_queue_addresses
from controlroom.errors.read.messages import (
    FailedMessageDetails,
    find_stored_body,
    get_failed_message,
    get_last_failed_message,
    get_stored_body,
)
from controlroom.errors.tasks import task_call
from controlroom.http.bodies import body_response_headers, read_body_bytes

router = APIRouter(tags=["errors"])

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def _route(path: str, *, methods: Sequence[str] = ("GET",), **options: Any) -> Callable[..., Any]:
    """Register ``path``, and ``path + "/"`` out of the schema (clients send both)."""

    def register(endpoint: Endpoint) -> Endpoint:
        router.add_api_route(path, endpoint, methods=list(methods), **options)
        router.add_api_route(
            path + "/", endpoint, methods=list(methods), include_in_schema=False, **options
        )
        return endpoint

    return register


_LIST_ADAPTER = TypeAdapter(list[FailedMessageListItem])
_NOT_FOUND = {404: {"description": "No failed message has this id."}}


def _list_page(
    request: Request, page: Paging, order: Ordering, where: FailedMessageFilter
) -> Response:
    with _engine(request).connect() as conn:
        result = list_failed_messages(
            conn,
            offset=page.offset,
            limit=page.per_page,
            where=where,
            order=order,
            exact_count_limit=exact_count_limit(request),
        )
    items = [list_item(summary) for summary in result.items]
    return paged_response(
        request, items, _LIST_ADAPTER, page, result.total, estimated=result.total_estimated
    )


@_route("/errors", response_model=list[FailedMessageListItem], responses=LIST_RESPONSES)
def list_errors(
    request: Request, page: PagingParams, order: OrderingParams, where: FilterParams
) -> Response:
    """Failed messages, filtered and sorted, one page at a time (default: newest
    ``time_sent`` first)."""
    return _list_page(request, page, order, where)


@_route("/errors", methods=("HEAD",), responses=LIST_RESPONSES)
def head_errors(
    request: Request, page: PagingParams, order: OrderingParams, where: FilterParams
) -> Response:
    """The headers ``GET /api/errors`` would answer (``Total-Count``, ``ETag``, ``Link``)."""
    return _list_page(request, page, order, where)


@_route(
    "/endpoints/{endpointname}/errors",
    response_model=list[FailedMessageListItem],
    responses=LIST_RESPONSES,
)
def list_endpoint_errors(
    request: Request,
    endpointname: Annotated[
        str, Path(max_length=400, description="The receiving endpoint's name (exact).")
    ],
    page: PagingParams,
    order: OrderingParams,
    where: FilterParams,
) -> Response:
    """Failed messages of one receiving endpoint, paged, filtered and sorted like
    ``/api/errors``."""
    endpoint = no_nul("path", "endpointname", endpointname)
    return _list_page(request, page, order, replace(where, receiving_endpoint=endpoint))


@_route("/errors/summary", response_model=ErrorsFacets)
def errors_summary(request: Request) -> Response:
    """ServiceControl's summary: the Unresolved failed messages counted by endpoint
    (``Endpoints``), host (``Hosts``) and message type (``Message types``), each most
    frequent first."""
    with _engine(request).connect() as conn:
        facets = unresolved_facets(conn)

    def facet(name: str, key: str) -> Facet:
        values = [FacetValue(range=item.value, count=item.count) for item in facets[key]]
        return Facet(name=name, values=values)

    summary = ErrorsFacets(
        endpoints=facet("Endpoints", "endpoint"),
        hosts=facet("Hosts", "host"),
        message_types=facet("Message types", "message_type"),
    )
    return Response(
        TypeAdapter(ErrorsFacets).dump_json(summary, by_alias=True),
        media_type="application/json",
    )


@_route("/errors/counts", response_model=ErrorsSummary)
def errors_counts(request: Request) -> Response:
    """How many failed messages there are in each status (Controlroom's own route)."""
    with _engine(request).connect() as conn:
        counts = count_by_status(conn)
    return json_response(
        ErrorsSummary.model_validate(
            {STATUS_NAMES[status]: count for status, count in counts.items()}
        )
    )


_ADDRESS_ADAPTER = TypeAdapter(list[QueueAddress])


@_route("/errors/queues/addresses", response_model=list[QueueAddress], responses=LIST_RESPONSES)
def queue_addresses(request: Request, page: PagingParams) -> Response:
    """The queues failed messages came from, by address, each with its number of failed
    messages (any status), paged."""
    with _engine(request).connect() as conn:
        result = list_queue_addresses(conn, offset=page.offset, limit=page.per_page)
    items = [
        QueueAddress(physical_address=item.address, failed_message_count=item.failed_message_count)
        for item in result.items
    ]
    return paged_response(request, items, _ADDRESS_ADAPTER, page, result.total)


@_route("/errors/last/{id}", response_model=FailedMessageLastView, responses=_NOT_FOUND)
def get_last_error(request: Request, failed_message_id: FailedMessageId) -> Response:
    """A failed message in the list shape, plus ``edited`` and ``edit_of``. 404 when
    unknown, 422 when ``id`` is not a UUID."""
    with _engine(request).connect() as conn:
        last = get_last_failed_message(conn, str(failed_message_id))
    if last is None:
        raise HTTPException(404, f"no failed message with id {failed_message_id}")
    view = FailedMessageLastView(
        **list_fields(last.summary), edited=last.edit_of is not None, edit_of=last.edit_of or ""
    )
    return json_response(view)


# Registered after every other /errors/<word> route: this one would take the word as an id.
@_route("/errors/{id}", response_model=FailedMessageDetail, responses=_NOT_FOUND)
def get_error(request: Request, failed_message_id: FailedMessageId) -> Response:
    """One failed message in full. 404 when unknown, 422 when ``id`` is not a UUID."""
    with _engine(request).connect() as conn:
        details = get_failed_message(conn, str(failed_message_id))
        if details is None:
            raise HTTPException(404, f"no failed message with id {failed_message_id}")
        call = _task_call(conn, details)
    return json_response(detail(details, call))


def _task_call(
    conn: sa.Connection, details: FailedMessageDetails
) -> tuple[list[Any], dict[str, Any]] | None:
    """A failed Python task's arguments from its body when the body is kept inline,
    uncompressed (``errors.tasks.task_call``); ``None`` for any other message, so only a
    Python task's detail reads its body (a row, never the body store)."""
    headers = json.loads(details.headers_json)
    kind = task_queue(headers)
    if kind is None or content_encoding(headers) is not None:
        return None
    stored = get_stored_body(conn, details.summary.id)
    if stored is None or stored.stored_externally or stored.text is None:
        return None
    return task_call(kind, stored.text)


BodyMessageId = Annotated[
    str,
    Path(
        alias="id",
        min_length=1,
        max_length=400,
        description="The failed message's id (UniqueMessageId), or its native "
        "NServiceBus.MessageId (then the latest failure of that message).",
    ),
]


@router.get(
    "/messages/{id}/body",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The exact body."},
        204: {"description": "The body is empty."},
        404: {
            "description": "No such failed message, or its body is missing or was not kept "
            "(the detail says why)."
        },
        503: {"description": "The body store cannot be read."},
    },
)
def get_body(request: Request, message_id: BodyMessageId) -> Response:
    """The exact bytes of a failed message's body, with its original content type.

    ``id`` is the failed message's id or its native message id (ServiceControl takes
    either). The body store's copy when the body is stored externally (it is
    authoritative: the inline text is then only a searchable prefix), else the inline text
    as UTF-8. A body with a content encoding (gzip) is served as stored, labelled with
    its ``Content-Encoding``, so a browser decodes it. 204 for an empty body (stored
    nowhere, as in ServiceControl); 404 when there is no such message or its body is
    missing, or was not kept (a Python task's body too large to send with its failure:
    the detail says why); 503 when the body store fails.
    """
    no_nul("path", "id", message_id)
    with _engine(request).connect() as conn:
        stored = find_stored_body(conn, message_id)
    if stored is None:
        raise HTTPException(404, f"no failed message with id {message_id[:100]!r}")
    if stored.not_kept is not None:
        raise HTTPException(404, f"the body was not kept: {stored.not_kept}")
    if stored.size == 0:
        return Response(status_code=204)
    data = read_body_bytes(request.app.state.body_store, stored, message_id)
    return Response(
        content=data,
        headers=body_response_headers(stored.content_type, stored.content_encoding),
    )


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = request.app.state.engine
    return engine
