"""Message redirects (ServiceControl's ``/api/redirects``): retries of messages that failed
in a decommissioned queue go to another one.

- ``GET /api/redirects``: paged like ``/api/errors`` (``Total-Count``, ``ETag``,
  ``Link``), ``sort`` ``from_physical_address`` (default) or ``to_physical_address``,
  ``direction`` (default ``desc``); other values read as the defaults.
- ``HEAD /api/redirect``: ``Total-Count``.
- ``POST /api/redirects`` ``{"fromphysicaladdress", "tophysicaladdress", "retryexisting"}``:
  201; 400 when an address is blank, 422 naming it when it is too long to keep (400
  characters) or, as the destination, to name a queue (255 bytes); 409 with the existing
  redirect when the address is already redirected elsewhere (201 when to the same
  address), 409 with the redirects
  that point at ``fromphysicaladdress`` when there are any. ``retryexisting`` retries
  the pending retries of that queue again, now redirected.
- ``PUT /api/redirects/{id}`` ``{"tophysicaladdress"}``: 204; 400 blank; 404 unknown;
  409 when the new destination is itself redirected.
- ``DELETE /api/redirects/{id}``: 204, known or not, as ServiceControl's ``DeleteRedirect``
  answers (``NoContent`` when it finds none).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated

import sqlalchemy as sa
from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, Field, TypeAdapter

from controlroom.api.auth import current_principal
from controlroom.api.paging import LIST_RESPONSES, PagingParams, paged_response
from controlroom.api.parameters import StoredText
from controlroom.api.views import UtcTimestamp
from controlroom.db.engine import begin_write
from controlroom.errors.read import redirects
from controlroom.errors.read.lists import pending_retry_ids
from controlroom.errors.retries import requests as retries
from controlroom.runtime.clock import utc_now
from controlroom.settings_sources import MAX_QUEUE_NAME_BYTES

router = APIRouter(tags=["redirects"])

RedirectId = Annotated[uuid.UUID, Path(alias="id", description="The redirect's id.")]


class RedirectView(BaseModel):
    """One redirect (ServiceControl's answer of ``GET /api/redirects``)."""

    message_redirect_id: str
    from_physical_address: str
    to_physical_address: str
    last_modified: UtcTimestamp


MAX_ADDRESS_LENGTH = 400
"""Characters of a redirect's address (``message_redirects``' columns)."""


def _names_a_queue(address: str) -> str:
    if len(address.encode("utf-8", "surrogatepass")) > MAX_QUEUE_NAME_BYTES:
        raise ValueError(
            f"no queue is named by more than {MAX_QUEUE_NAME_BYTES} bytes (UTF-8): a retry "
            "could never be sent there"
        )
    return address


class RedirectRequest(BaseModel):
    """ServiceControl's ``MessageRedirectRequest`` (lower-case names, as it reads them).
    An address is at most ``MAX_ADDRESS_LENGTH`` characters, a destination at most
    ``MAX_QUEUE_NAME_BYTES`` bytes: 422 naming the field otherwise."""

    fromphysicaladdress: Annotated[StoredText, Field(max_length=MAX_ADDRESS_LENGTH)] | None = None
    tophysicaladdress: (
        Annotated[StoredText, Field(max_length=MAX_ADDRESS_LENGTH), AfterValidator(_names_a_queue)]
        | None
    ) = None
    retryexisting: bool = False


_ADAPTER = TypeAdapter(list[RedirectView])
_LIST_ADAPTER = TypeAdapter(list[RedirectView])


def _view(item: redirects.Redirect) -> RedirectView:
    return RedirectView(
        message_redirect_id=item.id,
        from_physical_address=item.from_address,
        to_physical_address=item.to_address,
        last_modified=item.last_modified,
    )


@router.get("/redirects", response_model=list[RedirectView], responses=LIST_RESPONSES)
def list_redirects(
    request: Request,
    page: PagingParams,
    sort: Annotated[
        str | None, Query(description="from_physical_address or to_physical_address")
    ] = None,
    direction: Annotated[str | None, Query(description="asc or desc (default)")] = None,
) -> Response:
    """The redirects, paged and sorted."""
    key: redirects.RedirectSortKey = (
        "to_physical_address" if sort == "to_physical_address" else "from_physical_address"
    )
    with _engine(request).connect() as conn:
        found = redirects.list_redirects(
            conn, offset=page.offset, limit=page.per_page, sort=key, descending=direction != "asc"
        )
    return paged_response(
        request, [_view(item) for item in found.items], _ADAPTER, page, found.total
    )


@router.head("/redirect")
def count_redirects(request: Request) -> Response:
    """How many redirects there are, in ``Total-Count``."""
    with _engine(request).connect() as conn:
        total = redirects.count_redirects(conn)
    return Response(headers={"Total-Count": str(total)})


@router.post("/redirects", status_code=201, responses={400: {}, 409: {}})
def create_redirect(request: Request, body: RedirectRequest) -> Response:
    """Redirect the retries of messages that failed in ``fromphysicaladdress``."""
    source = (body.fromphysicaladdress or "").strip() and body.fromphysicaladdress
    target = (body.tophysicaladdress or "").strip() and body.tophysicaladdress
    if not source or not target:
        return JSONResponse(
            {"detail": "fromphysicaladdress and tophysicaladdress must not be blank"}, 400
        )
    with begin_write(_engine(request)) as conn:
        existing = redirects.get_redirect(conn, redirects.redirect_id(source))
        if existing is not None:
            if existing.to_address == target:  # the same redirect again: done already
                return JSONResponse(_view(existing).model_dump(mode="json"), 201)
            return _conflict(_view(existing).model_dump(mode="json"), "Duplicate")
        dependents = redirects.redirects_to(conn, source)
        if dependents:
            return _conflict(
                _LIST_ADAPTER.dump_python([_view(d) for d in dependents], mode="json"),
                "Dependents",
            )
        redirects.create_redirect(conn, source, target, utc_now())
    if body.retryexisting:
        _retry_pending_of(request, source)
    return Response(status_code=201)


@router.put("/redirects/{id}", status_code=204, responses={400: {}, 404: {}, 409: {}})
def update_redirect(request: Request, redirect_id: RedirectId, body: RedirectRequest) -> Response:
    """Point an existing redirect at ``tophysicaladdress``."""
    target = body.tophysicaladdress
    if target is None or not target.strip():
        return JSONResponse({"detail": "tophysicaladdress must not be blank"}, 400)
    with begin_write(_engine(request)) as conn:
        if redirects.get_redirect(conn, str(redirect_id)) is None:
            return JSONResponse({"detail": f"no redirect with id {redirect_id}"}, 404)
        if redirects.get_redirect(conn, redirects.redirect_id(target)) is not None:
            return JSONResponse({"detail": f"{target[:100]!r} is itself redirected"}, 409)
        redirects.change_redirect(conn, str(redirect_id), target, utc_now())
    return Response(status_code=204)


@router.delete("/redirects/{id}", status_code=204)
def delete_redirect(request: Request, redirect_id: RedirectId) -> Response:
    """End a redirect (204 whether or not it existed, as ServiceControl answers)."""
    with begin_write(_engine(request)) as conn:
        redirects.delete_redirect(conn, str(redirect_id))
    return Response(status_code=204)


def _conflict(content: object, reason: str) -> JSONResponse:
    # ServiceControl says which conflict in the reason phrase; HTTP/2 has none, so a header.
    return JSONResponse(content, status_code=409, headers={"X-Conflict-Reason": reason})


def _retry_pending_of(request: Request, queue_address: str) -> None:
    """Retry again the pending retries of ``queue_address`` (ServiceControl's
    ``RetryPendingMessages`` from the beginning of time until now)."""
    with _engine(request).connect() as conn:
        ids = pending_retry_ids(conn, queue_address, datetime.min.replace(tzinfo=UTC), utc_now())
    if ids:
        retries.retry_pending_messages(_engine(request), ids, by=current_principal(request).name)
        processor = getattr(request.app.state, "retry_processor", None)
        if processor is not None:
            processor.wake()


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = request.app.state.engine
    return engine
