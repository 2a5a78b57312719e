"""The failed-message read API, in ServiceControl's shapes.

Routes (each also answers with a trailing slash, as ServiceControl's clients sometimes
send it): ``GET|HEAD /api/errors``, ``GET /api/endpoints/{endpointname}/errors``,
``GET /api/errors/summary`` (ServiceControl's facets), ``GET /api/errors/counts``
(counts per status), ``GET /api/errors/queues/addresses``,
``GET /api/errors/last/{id}``, ``GET /api/errors/{id}`` and ``GET /api/messages/{id}/body``.

JSON is snake_case with null values left out (as ServiceControl writes it); times are ISO
8601 UTC with six fraction digits and ``Z``; statuses are ServiceControl's camelCase
names. Paging follows ServiceControl: ``page`` (from 1; below 1 reads as 1) and
``per_page`` (default 50; below 1 reads as 50, above 500 as 500), the total in the
``Total-Count`` header, a quoted ``ETag`` that changes when the answer changes (a request
whose ``If-None-Match`` names it gets 304), and ``first``/``prev``/``next``/``last`` links
in ``Link`` (relative to ``/api/``, as ServiceControl writes them). Bad input is a 422
naming the parameter, in FastAPI's ``{"detail": [{"loc": [...], "msg": ...}]}`` shape.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import quote, urlencode

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, PlainSerializer, TypeAdapter

from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.bodies import BodyNotFoundError, BodyStore
from controlroom.errors.read.counts import count_by_status
from controlroom.errors.read.facets import unresolved_facets
from controlroom.errors.read.filters import DEFAULT_SORT, SORT_KEYS, FailedMessageFilter, Ordering
from controlroom.errors.read.lists import list_failed_messages, list_queue_addresses
from controlroom.errors.read.messages import (
    FailedMessageDetails,
    StoredBody,
    find_stored_body,
    get_failed_message,
    get_last_failed_message,
)
from controlroom.errors.read.summaries import FailedMessageSummary
from controlroom.exceptions import BodyStoreError

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_PAGE = 10_000_000
"""Highest ``page`` accepted: beyond any real store, and it keeps the row offset in range."""

router = APIRouter(tags=["errors"])

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def format_utc(instant: datetime) -> str:
    """``2026-01-31T23:59:59.123456Z``: ISO 8601, UTC, always six fraction digits."""
    utc = instant.astimezone(UTC)
    # Not %Y: strftime writes the year 1 (.NET's DateTime.MinValue) as "1".
    return f"{utc.year:04d}-{utc:%m-%dT%H:%M:%S.%f}Z"


UtcTimestamp = Annotated[datetime, PlainSerializer(format_utc, return_type=str)]

StatusName = Literal["unresolved", "resolved", "retryIssued", "archived"]

STATUS_NAMES: dict[FailedMessageStatus, StatusName] = {
    FailedMessageStatus.UNRESOLVED: "unresolved",
    FailedMessageStatus.RESOLVED: "resolved",
    FailedMessageStatus.RETRY_ISSUED: "retryIssued",
    FailedMessageStatus.ARCHIVED: "archived",
}
# The ``status`` filter reads names case-insensitively (``retryissued`` or ``retryIssued``).
_STATUS_BY_NAME = {name.lower(): status for status, name in STATUS_NAMES.items()}

FailedMessageId = Annotated[
    uuid.UUID, Path(alias="id", description="The failed message's id (UniqueMessageId).")
]

RANGE_SEPARATOR = "..."


# --- response models ----------------------------------------------------------------------
class EndpointDetails(BaseModel):
    """An endpoint instance: its name, and its host when known."""

    name: str
    host_id: str | None = None
    host: str | None = None


class ExceptionDetails(BaseModel):
    """The exception of the stored (newest) attempt, as its headers tell it."""

    exception_type: str | None = None
    message: str | None = None
    source: str | None = None
    stack_trace: str | None = None


class FailedMessageListItem(BaseModel):
    """One failed message in a list (ServiceControl's ``FailedMessageView``).

    ``time_of_failure`` is the stored (newest) attempt's; ``last_modified`` is when the row
    last changed (a new attempt, a status change). Null fields are left out.
    """

    id: str
    message_id: str
    message_type: str | None = None
    time_sent: UtcTimestamp | None = None
    is_system_message: bool
    exception: ExceptionDetails
    number_of_processing_attempts: int
    status: StatusName
    sending_endpoint: EndpointDetails | None = None
    receiving_endpoint: EndpointDetails
    queue_address: str
    time_of_failure: UtcTimestamp
    last_modified: UtcTimestamp


class FailedMessageLastView(FailedMessageListItem):
    """``errors/last/{id}``: the list shape, plus whether the stored attempt is an edited
    copy of another failed message and which one (``edit_of``, empty when not edited;
    ServiceControl ``GetLatestFailedMessageView``)."""

    edited: bool
    edit_of: str


class FailureGroupRef(BaseModel):
    id: str
    title: str
    type: str  # the classifier's name


class FailureDetails(BaseModel):
    """Why an attempt failed (ServiceControl's ``FailureDetails``)."""

    address_of_failing_endpoint: str
    time_of_failure: UtcTimestamp
    exception: ExceptionDetails


class ProcessingAttempt(BaseModel):
    """One processing attempt (ServiceControl's ``FailedMessage.ProcessingAttempt``).

    Only the stored (newest) attempt is kept whole; an earlier one is counted, not kept,
    so it carries its message id and, for the first, the time it failed."""

    attempted_at: UtcTimestamp | None = None
    message_id: str
    headers: dict[str, str] | None = None
    message_metadata: dict[str, Any] | None = None
    failure_details: FailureDetails | None = None


class FailedMessageDetail(FailedMessageListItem):
    """One failed message in full, in ServiceControl's ``FailedMessage`` shape
    (``unique_message_id``, ``status``, ``processing_attempts``, ``failure_groups``) with
    the list's flat fields beside it: headers, failure window, groups, where its body is.

    ``body_url`` is relative to the API root (``/messages/{id}/body``), as in search
    results; ``body_size`` is the true size in bytes.
    """

    unique_message_id: str
    processing_attempts: list[ProcessingAttempt]
    failure_groups: list[FailureGroupRef]
    headers: dict[str, str | None]
    first_failure_at: UtcTimestamp
    last_failure_at: UtcTimestamp
    groups: list[FailureGroupRef]
    body_url: str
    body_size: int
    content_type: str


class FacetValue(BaseModel):
    range: str  # the value (RavenDB's facet term)
    count: int


class Facet(BaseModel):
    name: str
    values: list[FacetValue]


class ErrorsFacets(BaseModel):
    """ServiceControl's ``errors/summary``: the Unresolved failed messages counted by
    receiving endpoint, host and message type (``FailedMessageFacetsIndex``)."""

    model_config = {"populate_by_name": True}

    endpoints: Facet = Field(alias="Endpoints")
    hosts: Facet = Field(alias="Hosts")
    message_types: Facet = Field(alias="Message types")


class ErrorsSummary(BaseModel):
    """How many failed messages there are in each status (ServiceControl's status names)."""

    unresolved: int
    resolved: int
    retryIssued: int  # the status's name, as list items and the status filter spell it
    archived: int


class QueueAddress(BaseModel):
    """A queue failed messages came from (``NServiceBus.FailedQ``) and how many did
    (ServiceControl's ``QueueAddress``)."""

    physical_address: str
    failed_message_count: int


# --- parameters ---------------------------------------------------------------------------
def invalid_parameter(location: str, name: str, value: object, message: str) -> Exception:
    """A 422 naming the parameter, in the shape of FastAPI's own validation errors."""
    return RequestValidationError(
        [{"type": "value_error", "loc": (location, name), "msg": message, "input": value}]
    )


def parse_status_filter(
    text: str,
) -> tuple[frozenset[FailedMessageStatus], frozenset[FailedMessageStatus]]:
    """``"unresolved,-archived"`` -> (statuses to include, statuses to exclude).

    Comma-separated names, case-insensitive, spaces ignored; a ``-`` prefix excludes. An
    unknown name is ignored, as ServiceControl ignores it (``FilterByStatusWhere``): a
    filter of unknown names only is no filter.
    """
    include: set[FailedMessageStatus] = set()
    exclude: set[FailedMessageStatus] = set()
    for part in text.replace(" ", "").split(","):
        excluded = part.startswith("-")
        name = part[1:] if excluded else part
        status = _STATUS_BY_NAME.get(name.lower())
        if status is not None:
            (exclude if excluded else include).add(status)
    return frozenset(include), frozenset(exclude)


def parse_modified_range(text: str) -> tuple[datetime | None, datetime | None]:
    """``"<ISO from>...<ISO to>"`` -> (from, to), both inclusive, timezone-aware UTC.

    A time without an offset is UTC. One side may be empty (no bound there), not both.
    Source: ServiceControl ``FilterByLastModifiedRange``. Raises ``ValueError`` for a
    missing ``...``, an unreadable time, two empty sides, or ``from`` after ``to``.
    """
    start_text, separator, end_text = text.partition(RANGE_SEPARATOR)
    if not separator:
        raise ValueError(
            "expected '<from>...<to>' with ISO 8601 times, "
            "e.g. 2026-01-01T00:00:00Z...2026-01-31T23:59:59Z"
        )
    start = _parse_instant(start_text, "from")
    end = _parse_instant(end_text, "to")
    if start is None and end is None:
        raise ValueError("the range needs a 'from' or a 'to' time")
    if start is not None and end is not None and start > end:
        raise ValueError("'from' is after 'to'")
    return start, end


def _parse_instant(text: str, side: str) -> datetime | None:
    text = text.strip()
    if not text:
        return None
    # An unencoded "+" of an offset arrives as a space: read it back as "+".
    candidates = [text] if " " not in text else [text, "+".join(text.rsplit(" ", 1))]
    for candidate in candidates:
        try:
            instant = datetime.fromisoformat(candidate)
            if instant.tzinfo is None:
                instant = instant.replace(tzinfo=UTC)
            return instant.astimezone(UTC)
        except (ValueError, OverflowError):  # OverflowError: an offset past year 1 or 9999
            continue
    raise ValueError(f"the {side!r} time {text[:50]!r} is not an ISO 8601 time")


def _no_nul(location: str, name: str, value: str | None) -> str | None:
    # Stored text never holds NUL (PostgreSQL cannot), so such a value is a client error.
    if value is not None and "\x00" in value:
        raise invalid_parameter(location, name, value, "must not contain the NUL character")
    return value


@dataclass(frozen=True, slots=True)
class Paging:
    """A page as the request asked for it, after ServiceControl's corrections."""

    page: int  # from 1
    per_page: int

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.per_page


def paging(
    page: Annotated[
        int,
        Query(le=MAX_PAGE, description="Page number, from 1; a value below 1 reads as 1."),
    ] = 1,
    per_page: Annotated[
        int,
        Query(
            description=f"Items per page: default {DEFAULT_PAGE_SIZE}; below 1 reads as "
            f"{DEFAULT_PAGE_SIZE}, above {MAX_PAGE_SIZE} as {MAX_PAGE_SIZE}."
        ),
    ] = DEFAULT_PAGE_SIZE,
) -> Paging:
    """The ``page`` and ``per_page`` query parameters (a FastAPI dependency)."""
    per_page = min(per_page, MAX_PAGE_SIZE) if per_page >= 1 else DEFAULT_PAGE_SIZE
    return Paging(page=max(page, 1), per_page=per_page)


Direction = Literal["asc", "desc"]


def ordering(
    sort: Annotated[
        str | None,
        Query(
            max_length=200,
            description="Sort key: " + ", ".join(SORT_KEYS) + f"; empty or any other "
            f"value sorts by {DEFAULT_SORT} (ServiceControl's leniency). Ties are "
            "broken by id in the same direction.",
        ),
    ] = None,
    direction: Annotated[
        str | None,
        Query(max_length=200, description="asc or desc; any other value reads as desc."),
    ] = None,
) -> Ordering:
    """The ``sort`` and ``direction`` query parameters (a FastAPI dependency). Unknown
    values are the defaults, never a refusal: ServiceControl's ``GetSortInfo``."""
    key = next((known for known in SORT_KEYS if known == sort), DEFAULT_SORT)
    return Ordering(key=key, descending=direction != "asc")


def message_filter(
    status: Annotated[
        str | None,
        Query(
            max_length=200,
            description="Comma-separated statuses to include (unresolved, resolved, "
            "retryIssued, archived; any case); a '-' prefix excludes one, e.g. '-archived'.",
        ),
    ] = None,
    modified: Annotated[
        str | None,
        Query(
            max_length=200,
            description="Last-modified range '<ISO from>...<ISO to>', both bounds inclusive; "
            "a time without an offset is UTC; one side may be empty.",
            examples=["2026-01-01T00:00:00Z...2026-01-31T23:59:59Z"],
        ),
    ] = None,
    queueaddress: Annotated[
        str | None,
        Query(
            max_length=400,
            description="Only failures from this queue (any case); empty: no filter.",
        ),
    ] = None,
    queue_address_camel: Annotated[
        str | None,
        Query(alias="queueAddress", max_length=400, description="Same as queueaddress."),
    ] = None,
) -> FailedMessageFilter:
    """The ``status``, ``modified`` and ``queueaddress`` query parameters (a dependency).

    ServiceControl's leniency: unknown statuses are ignored, an empty queue address is no
    filter, and the address is also read as ``queueAddress``. Raises a 422 naming
    ``modified`` when it cannot be read.
    """
    address = queueaddress if queueaddress is not None else queue_address_camel
    where = FailedMessageFilter(queue_address=_no_nul("query", "queueaddress", address) or None)
    if status is not None:
        included, excluded = parse_status_filter(status)
        where = replace(where, statuses=included, excluded_statuses=excluded)
    if modified is not None:
        try:
            start, end = parse_modified_range(modified)
        except ValueError as exc:
            raise invalid_parameter("query", "modified", modified, str(exc)) from None
        where = replace(where, modified_from=start, modified_to=end)
    return where


PagingParams = Annotated[Paging, Depends(paging)]
OrderingParams = Annotated[Ordering, Depends(ordering)]
FilterParams = Annotated[FailedMessageFilter, Depends(message_filter)]

TOTAL_COUNT_ESTIMATED = "Total-Count-Estimated"
"""Response header: ``true`` when ``Total-Count`` is the database's estimate (README,
Compatibility); absent when it is exact."""

LIST_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "headers": {
            "Total-Count": {"description": "Items over all pages.", "schema": {"type": "integer"}},
            "ETag": {
                "description": "Quoted; changes when the answer changes.",
                "schema": {"type": "string"},
            },
            "Link": {
                "description": 'Paging links, e.g. <errors?per_page=50&page=2>; rel="next"; '
                "only when there is more than one page.",
                "schema": {"type": "string"},
            },
        }
    },
    304: {"description": "Unchanged: If-None-Match named the current ETag."},
}


# --- rendering ----------------------------------------------------------------------------
def json_response(content: Any, adapter: TypeAdapter[Any] | None = None) -> Response:
    """``content`` (a model, or what ``adapter`` serializes) as JSON without null fields."""
    if adapter is None:
        adapter = TypeAdapter(type(content))
    return Response(adapter.dump_json(content, exclude_none=True), media_type="application/json")


def paged_response(
    request: Request,
    items: Sequence[BaseModel],
    adapter: TypeAdapter[Any],
    page: Paging,
    total: int,
    *,
    estimated: bool = False,
) -> Response:
    """One page as JSON with ``Total-Count``, ``ETag`` and (when there is more than one
    page) ``Link``; 304 without a body when ``If-None-Match`` names the ETag. A ``HEAD``
    request gets the headers alone. An ``estimated`` total (the database's estimate, past
    the ``exact_count_limit`` setting) adds ``Total-Count-Estimated: true``; ``Total-Count``
    stays an integer and ``Link`` follows from it, so clients page as before."""
    body = adapter.dump_json(list(items), exclude_none=True)
    etag = _etag(body, total)
    headers = {"Total-Count": str(total), "ETag": etag}
    if estimated:
        headers[TOTAL_COUNT_ESTIMATED] = "true"
    links = paging_links(
        api_relative_path(request), dict(request.query_params), page.page, page.per_page, total
    )
    if links:
        headers["Link"] = links
    if _etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    if request.method == "HEAD":
        return Response(headers=headers, media_type="application/json")
    return Response(body, headers=headers, media_type="application/json")


def _etag(body: bytes, total: int) -> str:
    # The page and the total are the whole answer (Link follows from the total).
    digest = hashlib.sha256(body)
    digest.update(b"\x00%d" % total)
    return f'"{digest.hexdigest()[:32]}"'


def _etag_matches(if_none_match: str | None, etag: str) -> bool:
    if if_none_match is None:
        return False
    presented = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return etag in presented or "*" in presented


def api_relative_path(request: Request) -> str:
    """The request's path relative to ``/api/``, URL-encoded (``endpoints/Sales/errors``)."""
    path: str = request.scope["path"]
    root = request.scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return quote(path.removeprefix("/api/"), safe="/")


def paging_links(path: str, query: dict[str, str], page: int, per_page: int, total: int) -> str:
    """ServiceControl's ``Link`` header value: ``<path?...&page=N>; rel="..."`` for
    ``first``, ``prev``, ``last`` and ``next`` as they apply; empty when everything fits
    on one page or ``page`` is past the last one. ``query`` keeps the request's other
    parameters; ``path`` is relative to ``/api/``, as ServiceControl writes it."""
    last = math.ceil(total / per_page)
    if last <= 1 or page > last:
        return ""
    others = {name: value for name, value in query.items() if name != "page"}
    others["per_page"] = str(per_page)
    wanted = []
    if page != 1:
        wanted += [(1, "first"), (page - 1, "prev")]
    if page != last:
        wanted += [(last, "last"), (page + 1, "next")]
    return ", ".join(
        f'<{path}?{urlencode({**others, "page": number})}>; rel="{rel}"' for number, rel in wanted
    )


# --- routes -------------------------------------------------------------------------------
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
    endpoint = _no_nul("path", "endpointname", endpointname)
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
        **_list_fields(last.summary), edited=last.edit_of is not None, edit_of=last.edit_of or ""
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
    return json_response(detail(details))


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
        404: {"description": "No such failed message, or its body is missing."},
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
    missing; 503 when the body store fails.
    """
    _no_nul("path", "id", message_id)
    with _engine(request).connect() as conn:
        stored = find_stored_body(conn, message_id)
    if stored is None:
        raise HTTPException(404, f"no failed message with id {message_id[:100]!r}")
    if stored.size == 0:
        return Response(status_code=204)
    data = read_body_bytes(request.app.state.body_store, stored, message_id)
    return Response(
        content=data,
        headers=body_response_headers(stored.content_type, stored.content_encoding),
    )


# The body is attacker-controlled: a browser must never run it as a page of the API's
# origin (text/html, SVG), so it is sandboxed, never sniffed, and offered as a download.
_BODY_SAFETY_HEADERS = {
    "x-content-type-options": "nosniff",
    "content-security-policy": "sandbox; default-src 'none'",
    "content-disposition": "attachment",
}
# An HTTP content coding (RFC 9110 token, or a list of them): only such a value is sent.
_CONTENT_CODING = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*")


def body_response_headers(content_type: str, content_encoding: str | None = None) -> dict[str, str]:
    """Headers of a body answer: the stored content type as stored (Starlette's
    ``media_type`` would append a charset), when it is a legal header value, else
    ``application/octet-stream``; the body's ``Content-Encoding`` when it has a legal one
    (the bytes are sent as stored, so the client decodes them); plus the safety headers."""
    legal = content_type.isprintable() and content_type.isascii()
    headers = {
        "content-type": content_type if legal else "application/octet-stream",
        **_BODY_SAFETY_HEADERS,
    }
    if content_encoding is not None and _CONTENT_CODING.fullmatch(content_encoding.strip()):
        headers["content-encoding"] = content_encoding.strip()
    return headers


def read_body_bytes(store: BodyStore, stored: StoredBody, message_id: object) -> bytes:
    """The exact bytes of a stored body (see ``get_body``; empty for an empty body);
    raises ``HTTPException`` 404 or 503 as that route answers. ``message_id`` only names
    the message in those answers."""
    if stored.size == 0:
        return b""
    if stored.stored_externally:
        if stored.key is None:
            raise HTTPException(404, f"the body of failed message {message_id} has no store key")
        try:
            return store.get(stored.key)
        except BodyNotFoundError as exc:
            raise HTTPException(
                404, f"the body of failed message {message_id} is missing from the body store"
            ) from exc
        except BodyStoreError as exc:
            raise HTTPException(503, f"the body store cannot be read: {exc}") from exc
    if stored.text is None:
        raise HTTPException(404, f"failed message {message_id} has no body")
    return stored.text.encode("utf-8")


# --- mapping ------------------------------------------------------------------------------
def body_url(failed_message_id: str) -> str:
    """Where a failed message's body is served, relative to the API root (ServiceControl
    writes ``body_url`` so: ``/messages/{id}/body``)."""
    return f"/messages/{failed_message_id}/body"


def list_item(summary: FailedMessageSummary) -> FailedMessageListItem:
    """The list shape of a stored failed message."""
    return FailedMessageListItem(**_list_fields(summary))


def detail(details: FailedMessageDetails) -> FailedMessageDetail:
    """The full shape of a stored failed message."""
    summary = details.summary
    headers = json.loads(details.headers_json)
    groups = [
        FailureGroupRef(id=group.id, title=group.title, type=group.classifier)
        for group in details.groups
    ]
    return FailedMessageDetail(
        **_list_fields(summary),
        unique_message_id=summary.id,
        processing_attempts=processing_attempts(details, headers),
        failure_groups=groups,
        headers=headers,
        first_failure_at=details.first_failure_at,
        last_failure_at=summary.last_failure_at,
        groups=groups,
        body_url=body_url(summary.id),
        body_size=details.body_size,
        content_type=details.content_type,
    )


def processing_attempts(
    details: FailedMessageDetails, headers: dict[str, str | None]
) -> list[ProcessingAttempt]:
    """ServiceControl's ``processing_attempts``: one entry per counted attempt, oldest
    first, the stored attempt last and whole (``failure_details``, ``headers`` without
    null values, ``message_metadata`` keyed as ServiceControl keys it)."""
    summary = details.summary
    newest = ProcessingAttempt(
        attempted_at=summary.last_failure_at,
        message_id=summary.message_id,
        headers={name: value for name, value in headers.items() if value is not None},
        message_metadata=message_metadata(details),
        failure_details=FailureDetails(
            address_of_failing_endpoint=summary.queue_address,
            time_of_failure=summary.last_failure_at,
            exception=exception_details(summary),
        ),
    )
    earlier = [
        ProcessingAttempt(
            attempted_at=details.first_failure_at if index == 0 else None,
            message_id=summary.message_id,
        )
        for index in range(max(summary.number_of_processing_attempts - 1, 0))
    ]
    return [*earlier, newest]


def message_metadata(details: FailedMessageDetails) -> dict[str, Any]:
    """The stored attempt's ``message_metadata``, with ServiceControl's (PascalCase) keys
    for what Controlroom derives; absent values are left out."""
    summary = details.summary
    sending = sending_endpoint(summary)
    metadata: dict[str, Any] = {
        "MessageId": summary.message_id,
        "MessageType": summary.message_type,
        "IsSystemMessage": summary.is_system_message,
        "TimeSent": format_utc(summary.time_sent) if summary.time_sent else None,
        "ConversationId": details.conversation_id,
        "ContentType": details.content_type,
        "BodySize": details.body_size,
        "BodyUrl": body_url(summary.id),
        "ReceivingEndpoint": receiving_endpoint(summary).model_dump(exclude_none=True),
        "SendingEndpoint": sending.model_dump(exclude_none=True) if sending else None,
    }
    return {key: value for key, value in metadata.items() if value is not None}


def sending_endpoint(summary: FailedMessageSummary) -> EndpointDetails | None:
    """The sending endpoint of the stored attempt, ``None`` when the headers name none."""
    if summary.sending_endpoint is None:
        return None
    return EndpointDetails(
        name=summary.sending_endpoint, host_id=summary.sending_host_id, host=summary.sending_host
    )


def receiving_endpoint(summary: FailedMessageSummary) -> EndpointDetails:
    """The endpoint instance the stored attempt failed in."""
    return EndpointDetails(
        name=summary.receiving_endpoint,
        host_id=summary.receiving_host_id,
        host=summary.receiving_host,
    )


def exception_details(summary: FailedMessageSummary) -> ExceptionDetails:
    """The stored attempt's exception, as its headers tell it."""
    return ExceptionDetails(
        exception_type=summary.exception_type,
        message=summary.exception_message,
        source=summary.exception_source,
        stack_trace=summary.stack_trace,
    )


def _list_fields(summary: FailedMessageSummary) -> dict[str, object]:
    return {
        "id": summary.id,
        "message_id": summary.message_id,
        "message_type": summary.message_type,
        "time_sent": summary.time_sent,
        "is_system_message": summary.is_system_message,
        "exception": exception_details(summary),
        "number_of_processing_attempts": summary.number_of_processing_attempts,
        "status": STATUS_NAMES[summary.status],
        "sending_endpoint": sending_endpoint(summary),
        "receiving_endpoint": receiving_endpoint(summary),
        "queue_address": summary.queue_address,
        "time_of_failure": summary.last_failure_at,
        "last_modified": summary.last_modified,
    }


def exact_count_limit(request: Request) -> int:
    """Up to how many matches lists count exactly (the ``exact_count_limit`` setting)."""
    limit: int = request.app.state.settings.exact_count_limit
    return limit


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = request.app.state.engine
    return engine
