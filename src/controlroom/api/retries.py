"""The retry API, in ServiceControl's routes: retry by id, selection, queue, endpoint,
group or everything; pending retries; edit and retry; the retry history.

Every retry route answers 202 with the operation and the retry batches it created (the
retry processor sends them in the background); 404 names unknown ids or groups, 409
names messages that cannot be retried (archived, resolved) or are being retried.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Body, HTTPException, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from controlroom.api.archive import QueueWindow
from controlroom.api.auth import current_principal
from controlroom.api.parameters import StoredText
from controlroom.api.views import UtcTimestamp
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.read.lists import pending_retry_ids
from controlroom.errors.retries import requests as retries
from controlroom.errors.retries import wire as retry_wire
from controlroom.transport.base import Transport, TransportError

router = APIRouter(tags=["retries"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"description": "An id or group names nothing."},
    409: {"description": "A message is archived or resolved, or being retried."},
}


# --- response models ----------------------------------------------------------------------
class RetryBatchModel(BaseModel):
    id: str
    message_count: int
    status: str  # marking, staging, forwarding, done


class RetryAccepted(BaseModel):
    """What a retry request created. ``operation_id`` is left out when it claimed nothing
    (every selected message was already in a retry, or none matched), and names the
    running operation when one of the same group, queue, endpoint or "all" was in
    progress (the request then started none, ``batches`` empty); ``request_id`` is
    ServiceControl's RequestId (group id, queue address, endpoint, message id, else
    ``operation_id``). Null fields are left out of every answer, as ServiceControl does."""

    operation_id: str | None = None
    request_id: str | None = None
    retry_type: str
    message_count: int  # messages claimed by this request's batches
    skipped_count: int  # selected messages another retry already holds
    batches: list[RetryBatchModel]
    preparing: bool | None = None  # true: the rest of the batches are made after the answer


class RetryOperationModel(BaseModel):
    """One retry operation and its progress."""

    id: str
    request_id: str
    retry_type: str
    originator: str | None = None
    classifier: str | None = None
    message_count: int
    forwarded_count: int
    skipped_count: int
    failed: bool
    failure_reason: str | None = None  # why messages were given up, when they were
    acknowledged: bool
    start_time: UtcTimestamp
    last_modified: UtcTimestamp
    prepared_time: UtcTimestamp | None = None
    completion_time: UtcTimestamp | None = None
    batches: list[RetryBatchModel]


class HistoricOperation(BaseModel):
    """A completed retry operation (ServiceControl's ``HistoricRetryOperation``)."""

    request_id: str
    retry_type: str
    start_time: UtcTimestamp
    completion_time: UtcTimestamp
    originator: str | None = None
    failed: bool
    number_of_messages_processed: int


class UnacknowledgedOperation(HistoricOperation):
    """A completed operation the operator has not dismissed yet."""

    last: UtcTimestamp
    classifier: str | None = None


class RetryHistoryModel(BaseModel):
    historic_operations: list[HistoricOperation]
    unacknowledged_operations: list[UnacknowledgedOperation]


class EditConfiguration(BaseModel):
    enabled: bool
    sensitive_headers: list[str]
    locked_headers: list[str]


class HeaderItem(BaseModel):
    key: str
    value: str | None


class EditRequest(BaseModel):
    """An edited message: the new body (text) and the full header set to send.
    ``message_headers`` is an object, or a list of ``{"key", "value"}``."""

    message_body: str
    message_headers: dict[str, str | None] | list[HeaderItem] | None

    def headers(self) -> dict[str, str | None]:
        """The headers to send; raises 400 when ``message_headers`` is null, as
        ServiceControl answers it."""
        if self.message_headers is None:
            raise HTTPException(400, "message_headers: null; send the full header set")
        if isinstance(self.message_headers, dict):
            return self.message_headers
        return {item.key: item.value for item in self.message_headers}


class EditAccepted(BaseModel):
    edit_ignored: bool  # ServiceControl's field; false when 202
    edit_id: str
    message_id: str  # NServiceBus.MessageId of the edited copy
    destination: str


class EditIgnored(BaseModel):
    """ServiceControl's 200 answer to an edit of a message already edited (or being
    edited): nothing was sent."""

    edit_ignored: bool = True


# --- retry routes -------------------------------------------------------------------------
@router.post(
    "/errors/{id}/retry", status_code=202, responses=_ERRORS, response_model_exclude_none=True
)
def retry_one(
    request: Request, failed_message_id: Annotated[str, Path(alias="id")]
) -> RetryAccepted:
    """Retry one failed message. An id that names no failed message is accepted and
    changes nothing (``message_count`` 0, no operation), as ServiceControl accepts it."""
    nothing = RetryAccepted(
        request_id=failed_message_id,
        retry_type=str(retries.RetryType.SINGLE_MESSAGE),
        message_count=0,
        skipped_count=0,
        batches=[],
    )
    return _accepted(request, retries.retry_message, failed_message_id, if_unknown=nothing)


@router.post("/errors/retry", status_code=202, responses=_ERRORS, response_model_exclude_none=True)
def retry_selection(request: Request, ids: Annotated[list[StoredText], Body()]) -> RetryAccepted:
    """Retry the failed messages whose ids the body lists (a JSON array)."""
    _check_ids(ids)
    return _accepted(request, retries.retry_messages, ids)


@router.post(
    "/errors/queues/{queueaddress}/retry", status_code=202, response_model_exclude_none=True
)
def retry_queue(
    request: Request, queue_address: Annotated[str, Path(alias="queueaddress")]
) -> RetryAccepted:
    """Retry every Unresolved message that failed in this queue address."""
    return _accepted(request, retries.retry_queue, queue_address, selection=True)


@router.post("/errors/retry/all", status_code=202, response_model_exclude_none=True)
def retry_everything(request: Request) -> RetryAccepted:
    """Retry every Unresolved message."""
    return _accepted(request, retries.retry_all, selection=True)


@router.post("/errors/{endpointname}/retry/all", status_code=202, response_model_exclude_none=True)
def retry_endpoint(
    request: Request, endpoint_name: Annotated[str, Path(alias="endpointname")]
) -> RetryAccepted:
    """Retry every Unresolved message of this receiving endpoint."""
    return _accepted(request, retries.retry_endpoint, endpoint_name, selection=True)


@router.post(
    "/recoverability/groups/{groupId}/errors/retry",
    status_code=202,
    responses=_ERRORS,
    response_model_exclude_none=True,
)
def retry_group(request: Request, group_id: Annotated[str, Path(alias="groupId")]) -> RetryAccepted:
    """Retry the Unresolved messages of a failure group."""
    return _accepted(request, retries.retry_group, group_id, selection=True)


@router.post(
    "/pendingretries/retry", status_code=202, responses=_ERRORS, response_model_exclude_none=True
)
def retry_pending(request: Request, ids: Annotated[list[StoredText], Body()]) -> RetryAccepted:
    """Retry again messages whose retry was sent but never confirmed (a JSON array)."""
    _check_ids(ids)
    return _accepted(request, retries.retry_pending_messages, ids)


@router.post(
    "/pendingretries/queues/retry",
    status_code=202,
    responses={400: {"description": "queueaddress blank, or from/to unreadable."}},
    response_model_exclude_none=True,
)
def retry_queue_pending(request: Request, body: QueueWindow) -> RetryAccepted:
    """Retry again the pending retries that failed in ``queueaddress`` and whose retry was
    asked within ``from``..``to`` (ServiceControl's ``RetryPendingMessages``)."""
    queue_address, start, end = body.window()
    with _engine(request).connect() as conn:
        ids = pending_retry_ids(conn, queue_address, start, end)
    if not ids:
        return RetryAccepted(
            retry_type=str(retries.RetryType.MULTIPLE_MESSAGES),
            message_count=0,
            skipped_count=0,
            batches=[],
        )
    return _accepted(request, retries.retry_pending_messages, ids)


@router.get(
    "/retries/{operation_id}",
    responses={404: {"description": "No such operation."}},
    response_model_exclude_none=True,
)
def get_retry_operation(request: Request, operation_id: str) -> RetryOperationModel:
    """One retry operation with its batches and counts."""
    with _engine(request).connect() as conn:
        operation = retries.get_operation(conn, operation_id)
    if operation is None:
        raise HTTPException(404, f"no retry operation with id {operation_id}")
    return RetryOperationModel(
        id=operation.id,
        request_id=operation.request_id,
        retry_type=str(operation.retry_type),
        originator=operation.originator,
        classifier=operation.classifier,
        message_count=operation.message_count,
        forwarded_count=operation.forwarded_count,
        skipped_count=operation.skipped_count,
        failed=operation.failed,
        failure_reason=operation.failure_reason,
        acknowledged=operation.acknowledged,
        start_time=operation.started_at,
        last_modified=operation.last_modified,
        prepared_time=operation.prepared_at,
        completion_time=operation.completed_at,
        batches=[_batch(batch) for batch in operation.batches],
    )


@router.get("/recoverability/history", response_model_exclude_none=True)
def get_retry_history(request: Request) -> RetryHistoryModel:
    """Recent completed retry operations, and those not acknowledged yet."""
    with _engine(request).connect() as conn:
        history = retries.get_history(conn)
    return RetryHistoryModel(
        historic_operations=[
            HistoricOperation(**_historic_fields(item)) for item in history.historic
        ],
        unacknowledged_operations=[
            UnacknowledgedOperation(
                **_historic_fields(item), last=item.last_modified, classifier=item.classifier
            )
            for item in history.unacknowledged
        ],
    )


# --- edit and retry -----------------------------------------------------------------------
@router.get("/edit/config")
def get_edit_configuration() -> EditConfiguration:
    """Whether editing is on, and the headers an edit may not change or should not."""
    return EditConfiguration(
        enabled=True,
        sensitive_headers=list(retry_wire.SENSITIVE_HEADERS),
        locked_headers=list(retry_wire.LOCKED_HEADERS),
    )


@router.post(
    "/edit/{id}",
    status_code=202,
    response_model=EditAccepted,
    responses={
        200: {"model": EditIgnored, "description": "Already edited (or being edited)."},
        400: {"description": "A locked header changed, a header is null, the body is empty."},
        **_ERRORS,
        503: {"description": "The message could not be sent; the original is unchanged."},
    },
)
async def edit_and_retry(
    request: Request,
    failed_message_id: Annotated[str, Path(alias="id")],
    edit: Annotated[EditRequest, Body()],
) -> EditAccepted | JSONResponse:
    """Send an edited copy of an Unresolved failed message; the original becomes Resolved.

    A repeated edit (the message was edited already, so it is Resolved, or an edit of it
    is being sent) answers 200 ``{"edit_ignored": true}`` and sends nothing, as
    ServiceControl answers it; a null header value is a 400 naming the header, null
    ``message_headers`` or an unknown id a 400 (ServiceControl's answers).
    """
    headers = edit.headers()
    nulls = sorted(name for name, value in headers.items() if value is None)
    if nulls:
        raise HTTPException(400, f"message_headers: null value of {', '.join(nulls)[:500]}")
    transport: Transport | None = getattr(request.app.state, "transport", None)
    if transport is None:
        raise HTTPException(503, "no transport is configured to send the edited message")
    try:
        result = await retries.edit_and_retry(
            _engine(request),
            transport,
            failed_message_id,
            body=edit.message_body,
            headers=headers,
            acknowledgement_queue=request.app.state.settings.error_queue,
        )
    except (retries.InvalidEdit, retries.UnknownFailedMessages) as exc:
        # ServiceControl answers an edit of an unknown id 400 too.
        raise HTTPException(400, str(exc)) from exc
    except retries.MessageBeingRetried:
        return JSONResponse(EditIgnored().model_dump(), status_code=200)
    except retries.NotRetryable as exc:
        if set(exc.statuses.values()) == {FailedMessageStatus.RESOLVED}:
            return JSONResponse(EditIgnored().model_dump(), status_code=200)
        raise _http_error(exc) from exc
    except retries.RetryRequestError as exc:
        raise _http_error(exc) from exc
    except TransportError as exc:
        raise HTTPException(503, f"the edited message could not be sent: {exc}") from exc
    return EditAccepted(
        edit_ignored=False,
        edit_id=result.edit_id,
        message_id=result.message_id,
        destination=result.destination,
    )


# --- helpers ------------------------------------------------------------------------------
def _accepted(
    request: Request,
    action: Callable[..., retries.RetryRequestResult],
    *args: Any,
    if_unknown: RetryAccepted | None = None,
    selection: bool = False,
) -> RetryAccepted:
    """``action``'s result as the 202 answer; ``if_unknown``, when given, is the answer
    when an id names no failed message (else a 404). A ``selection``'s request (a group,
    a queue, an endpoint, all) answers within ``retries.ANSWER_WITHIN`` and makes the
    rest of its batches after (``preparing``)."""
    processor = getattr(request.app.state, "retry_processor", None)
    options: dict[str, Any] = {}
    if selection:
        options["answer_within"] = retries.ANSWER_WITHIN
        options["on_batches"] = processor.wake if processor is not None else None
    try:
        result = action(_engine(request), *args, by=current_principal(request).name, **options)
    except retries.UnknownFailedMessages as exc:
        if if_unknown is not None:
            return if_unknown
        raise _http_error(exc) from exc
    except retries.RetryRequestError as exc:
        raise _http_error(exc) from exc
    if processor is not None and result.batches:
        processor.wake()
    named = result.batches or result.already_running or result.preparing
    operation_id = result.operation_id if named else None
    return RetryAccepted(
        operation_id=operation_id,
        request_id=result.target or operation_id,
        retry_type=str(result.retry_type),
        message_count=result.message_count,
        skipped_count=result.skipped_count,
        batches=[_batch(batch) for batch in result.batches],
        preparing=result.preparing or None,
    )


def _http_error(exc: retries.RetryRequestError) -> HTTPException:
    if isinstance(exc, retries.UnknownFailedMessages | retries.UnknownGroup):
        return HTTPException(404, str(exc))
    return HTTPException(409, str(exc))


def _check_ids(ids: list[str]) -> None:
    if any(not item.strip() for item in ids):
        raise HTTPException(400, "the body (a JSON array of failed message ids) has an empty id")


def _batch(batch: retries.RetryBatchInfo) -> RetryBatchModel:
    return RetryBatchModel(id=batch.id, message_count=batch.message_count, status=batch.status)


def _historic_fields(item: retries.RetryOperation) -> dict[str, Any]:
    completed: datetime = item.completed_at or item.last_modified
    return {
        "request_id": item.request_id,
        "retry_type": str(item.retry_type),
        "start_time": item.started_at,
        "completion_time": completed,
        "originator": item.originator,
        "failed": item.failed,
        "number_of_messages_processed": item.forwarded_count,
    }


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = request.app.state.engine
    return engine


__all__ = ["router"]
