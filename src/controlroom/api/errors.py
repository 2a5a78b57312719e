"""The failed-message read API, in ServiceControl's shapes.

``GET /api/errors`` (paged), ``GET /api/errors/{id}`` and ``GET /api/messages/{id}/body``.
JSON is snake_case; times are ISO 8601 UTC with six fraction digits and ``Z``; statuses
are ServiceControl's camelCase names. Paging follows ServiceControl: ``page`` (from 1;
below 1 reads as 1) and ``per_page`` (default 50; below 1 reads as 50, above 500 as
500), the total in the ``Total-Count`` header and ``first``/``prev``/``next``/``last``
links in ``Link`` (relative to ``/api/``, as ServiceControl writes them).
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime
from typing import Annotated, Literal
from urllib.parse import urlencode

import sqlalchemy as sa
from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel, PlainSerializer

from controlroom.db.tables import FailedMessageStatus
from controlroom.errors import queries
from controlroom.errors.bodies import BodyNotFoundError, BodyStore
from controlroom.exceptions import BodyStoreError

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500

router = APIRouter(tags=["errors"])


def format_utc(instant: datetime) -> str:
    """``2026-01-31T23:59:59.123456Z``: ISO 8601, UTC, always six fraction digits."""
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


UtcTimestamp = Annotated[datetime, PlainSerializer(format_utc, return_type=str)]

StatusName = Literal["unresolved", "resolved", "retryIssued", "archived"]

STATUS_NAMES: dict[FailedMessageStatus, StatusName] = {
    FailedMessageStatus.UNRESOLVED: "unresolved",
    FailedMessageStatus.RESOLVED: "resolved",
    FailedMessageStatus.RETRY_ISSUED: "retryIssued",
    FailedMessageStatus.ARCHIVED: "archived",
}

FailedMessageId = Annotated[
    uuid.UUID, Path(alias="id", description="The failed message's id (UniqueMessageId).")
]


# --- response models ----------------------------------------------------------------------
class EndpointDetails(BaseModel):
    name: str
    host_id: str | None
    host: str | None


class ExceptionDetails(BaseModel):
    exception_type: str | None
    message: str | None
    source: str | None
    stack_trace: str | None


class FailedMessageListItem(BaseModel):
    """One failed message in a list (ServiceControl's ``FailedMessageView``)."""

    id: str
    message_id: str
    message_type: str | None
    time_sent: UtcTimestamp | None
    is_system_message: bool
    exception: ExceptionDetails
    number_of_processing_attempts: int
    status: StatusName
    sending_endpoint: EndpointDetails | None
    receiving_endpoint: EndpointDetails
    queue_address: str
    time_of_failure: UtcTimestamp
    last_modified: UtcTimestamp


class FailureGroupRef(BaseModel):
    id: str
    title: str
    type: str  # the classifier's name


class FailedMessageDetail(FailedMessageListItem):
    """One failed message in full: headers, failure window, groups, where its body is."""

    headers: dict[str, str | None]
    first_failure_at: UtcTimestamp
    last_failure_at: UtcTimestamp
    groups: list[FailureGroupRef]
    body_url: str
    body_size: int  # bytes
    content_type: str


# --- routes -------------------------------------------------------------------------------
@router.get("/errors")
def list_errors(
    request: Request, response: Response, page: int = 1, per_page: int = DEFAULT_PAGE_SIZE
) -> list[FailedMessageListItem]:
    """Failed messages, newest time of failure first, one page at a time."""
    page = max(page, 1)
    per_page = min(per_page, MAX_PAGE_SIZE) if per_page >= 1 else DEFAULT_PAGE_SIZE
    with _engine(request).connect() as conn:
        result = queries.list_failed_messages(conn, offset=(page - 1) * per_page, limit=per_page)
    response.headers["Total-Count"] = str(result.total)
    links = paging_links("errors", dict(request.query_params), page, per_page, result.total)
    if links:
        response.headers["Link"] = links
    return [list_item(summary) for summary in result.items]


@router.get("/errors/{id}", responses={404: {"description": "No failed message has this id."}})
def get_error(request: Request, failed_message_id: FailedMessageId) -> FailedMessageDetail:
    """One failed message in full. 404 when unknown, 422 when ``id`` is not a UUID."""
    with _engine(request).connect() as conn:
        details = queries.get_failed_message(conn, str(failed_message_id))
    if details is None:
        raise HTTPException(404, f"no failed message with id {failed_message_id}")
    return detail(details)


@router.get(
    "/messages/{id}/body",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The exact body."},
        404: {"description": "No such failed message, or its body is missing."},
    },
)
def get_body(request: Request, failed_message_id: FailedMessageId) -> Response:
    """The exact bytes of a failed message's body, with its original content type.

    The body store's copy when the body is stored externally (it is authoritative: the
    inline text is then only a searchable prefix), else the inline text as UTF-8. 404
    when there is no such message or its body is missing; 503 when the body store fails.
    """
    with _engine(request).connect() as conn:
        stored = queries.get_stored_body(conn, str(failed_message_id))
    if stored is None:
        raise HTTPException(404, f"no failed message with id {failed_message_id}")
    data = _body_bytes(request.app.state.body_store, stored, failed_message_id)
    # Set the header as stored: Starlette's media_type would append "; charset=utf-8".
    return Response(content=data, headers={"content-type": stored.content_type})


def _body_bytes(store: BodyStore, stored: queries.StoredBody, message_id: uuid.UUID) -> bytes:
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
def list_item(summary: queries.FailedMessageSummary) -> FailedMessageListItem:
    """The list shape of a stored failed message."""
    return FailedMessageListItem(**_list_fields(summary))


def detail(details: queries.FailedMessageDetails) -> FailedMessageDetail:
    """The full shape of a stored failed message."""
    summary = details.summary
    return FailedMessageDetail(
        **_list_fields(summary),
        headers=json.loads(details.headers_json),
        first_failure_at=details.first_failure_at,
        last_failure_at=summary.last_failure_at,
        groups=[
            FailureGroupRef(id=group.id, title=group.title, type=group.classifier)
            for group in details.groups
        ],
        body_url=f"/api/messages/{summary.id}/body",
        body_size=details.body_size,
        content_type=details.content_type,
    )


def _list_fields(summary: queries.FailedMessageSummary) -> dict[str, object]:
    sending = None
    if summary.sending_endpoint is not None:
        sending = EndpointDetails(
            name=summary.sending_endpoint,
            host_id=summary.sending_host_id,
            host=summary.sending_host,
        )
    return {
        "id": summary.id,
        "message_id": summary.message_id,
        "message_type": summary.message_type,
        "time_sent": summary.time_sent,
        "is_system_message": summary.is_system_message,
        "exception": ExceptionDetails(
            exception_type=summary.exception_type,
            message=summary.exception_message,
            source=summary.exception_source,
            stack_trace=summary.stack_trace,
        ),
        "number_of_processing_attempts": summary.number_of_processing_attempts,
        "status": STATUS_NAMES[summary.status],
        "sending_endpoint": sending,
        "receiving_endpoint": EndpointDetails(
            name=summary.receiving_endpoint,
            host_id=summary.receiving_host_id,
            host=summary.receiving_host,
        ),
        "queue_address": summary.queue_address,
        "time_of_failure": summary.last_failure_at,
        "last_modified": summary.last_modified,
    }


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


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = request.app.state.engine
    return engine
