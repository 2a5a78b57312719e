"""The failed-message views of the API, in ServiceControl's shapes (``FailedMessageView``,
``FailedMessage``, facets, queue addresses), and how a stored failed message maps onto
them.

JSON is snake_case with null values left out (as ServiceControl writes it); times are ISO
8601 UTC with six fraction digits and ``Z``; statuses are ServiceControl's camelCase
names (``controlroom.errors.read.filters.STATUS_NAMES``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any, TypedDict

from fastapi import Response
from pydantic import BaseModel, Field, PlainSerializer, TypeAdapter

from controlroom.errors import tracebacks
from controlroom.errors.ingest.headers import body_not_kept
from controlroom.errors.read.filter_text import STATUS_NAMES, StatusName
from controlroom.errors.read.messages import FailedMessageDetails
from controlroom.errors.read.summaries import FailedMessageSummary


def format_utc(instant: datetime) -> str:
    """``2026-01-31T23:59:59.123456Z``: ISO 8601, UTC, always six fraction digits."""
    utc = instant.astimezone(UTC)
    # Not %Y: strftime writes the year 1 (.NET's DateTime.MinValue) as "1".
    return f"{utc.year:04d}-{utc:%m-%dT%H:%M:%S.%f}Z"


UtcTimestamp = Annotated[datetime, PlainSerializer(format_utc, return_type=str)]


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


class ListItemFields(TypedDict):
    """The keyword arguments of ``FailedMessageListItem`` (and of the models that extend
    it), as ``list_fields`` builds them."""

    id: str
    message_id: str
    message_type: str | None
    time_sent: datetime | None
    is_system_message: bool
    exception: ExceptionDetails
    number_of_processing_attempts: int
    status: StatusName
    sending_endpoint: EndpointDetails | None
    receiving_endpoint: EndpointDetails
    queue_address: str
    time_of_failure: datetime
    last_modified: datetime


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


class PythonFrame(BaseModel):
    """One frame of a Python traceback: ``file`` as written, ``line``, ``function``, the
    ``source`` line(s) printed below it (``""`` when none), and whether it is the
    ``application``'s own code (not the standard library's, not an installed package's)."""

    file: str
    line: int | None = None
    function: str
    source: str
    application: bool


class PythonTracebackSection(BaseModel):
    """One ``Traceback (most recent call last):`` section: its frames, outermost first,
    and the text after them (the exception line; the sentence linking a cause to the next
    section)."""

    frames: list[PythonFrame]
    text: str


class PythonTraceback(BaseModel):
    """A Python stack trace read as frames (Controlroom's own field); the last section is
    the exception that escaped."""

    preamble: str
    sections: list[PythonTracebackSection]


class TaskArguments(BaseModel):
    """A failed Python task's arguments, read from its body (Controlroom's own field)."""

    args: list[Any]
    kwargs: dict[str, Any]


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
    python_traceback: PythonTraceback | None = None
    """Controlroom's own: the stack trace read as frames when it is a Python traceback,
    left out otherwise (ServiceControl's fields are unchanged)."""
    task_arguments: TaskArguments | None = None
    """Controlroom's own: a failed Celery or Dramatiq task's ``args`` and ``kwargs`` when
    its body is kept inline and has its task queue's JSON shape, left out otherwise."""
    body_not_kept: str | None = None
    """Controlroom's own: why the body was not kept (a Python task's body too large to send
    with its failure: ``Controlroom.TaskQueue.BodyNotKept``); left out when it was. Such
    a message cannot be retried, only edited with a body."""


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


def json_response(content: Any, adapter: TypeAdapter[Any] | None = None) -> Response:
    """``content`` (a model, or what ``adapter`` serializes) as JSON without null fields."""
    if adapter is None:
        adapter = TypeAdapter(type(content))
    return Response(adapter.dump_json(content, exclude_none=True), media_type="application/json")


def body_url(failed_message_id: str) -> str:
    """Where a failed message's body is served, relative to the API root (ServiceControl
    writes ``body_url`` so: ``/messages/{id}/body``)."""
    return f"/messages/{failed_message_id}/body"


def list_item(summary: FailedMessageSummary) -> FailedMessageListItem:
    """The list shape of a stored failed message."""
    return FailedMessageListItem(**list_fields(summary))


def detail(
    details: FailedMessageDetails, task_call: tuple[list[Any], dict[str, Any]] | None = None
) -> FailedMessageDetail:
    """The full shape of a stored failed message; ``task_call`` the Python task's
    arguments when known (``errors.tasks.task_call``)."""
    summary = details.summary
    headers = json.loads(details.headers_json)
    groups = [
        FailureGroupRef(id=group.id, title=group.title, type=group.classifier)
        for group in details.groups
    ]
    return FailedMessageDetail(
        **list_fields(summary),
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
        python_traceback=python_traceback(
            summary.stack_trace, headers.get("NServiceBus.ExceptionInfo.Message")
        ),
        task_arguments=None
        if task_call is None
        else TaskArguments(args=task_call[0], kwargs=task_call[1]),
        body_not_kept=body_not_kept(headers) if details.body_size == 0 else None,
    )


def python_traceback(stack_trace: str | None, message: str | None = None) -> PythonTraceback | None:
    """``stack_trace`` read as frames (``errors/tracebacks.py``), the escaping exception's
    ``message`` read as text, or ``None`` when it is not a Python traceback."""
    parsed = tracebacks.parse_traceback(stack_trace, message) if stack_trace else None
    if parsed is None:
        return None
    return PythonTraceback(
        preamble=parsed.preamble,
        sections=[
            PythonTracebackSection(
                frames=[
                    PythonFrame(
                        file=frame.path,
                        line=frame.line,
                        function=frame.function,
                        source=frame.source,
                        application=frame.application,
                    )
                    for frame in section.frames
                ],
                text=section.text,
            )
            for section in parsed.sections
        ],
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


def list_fields(summary: FailedMessageSummary) -> ListItemFields:
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
