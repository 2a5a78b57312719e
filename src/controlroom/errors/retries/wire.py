"""The retry wire contract: what a retried or edited message carries (pure, no I/O).

Source: docs/decisions.md "A retry sends what ServiceControl's return-to-sender sends" and
"Edits lock the identity and retry headers"; ServiceControl's ``HeaderFilter`` / ``RetryProcessor``
/ ``ReturnToSender`` / ``EditHandler``. A retry sends the stored headers minus the failure headers
(prefix match, ``STRIPPED_HEADER_PREFIXES``) plus the retry headers the endpoint receives from
ServiceControl's return-to-sender (``retry_headers``): the failed message's
``ServiceControl.Retry.UniqueMessageId`` and ``ServiceControl.Retry.AcknowledgementQueue``; never
``ServiceControl.Retry.Attempt.MessageId`` (ServiceControl's staging bookkeeping). The message's
target is the queue it failed in (``NServiceBus.FailedQ``), or that queue's redirect
(``/api/redirects``). It goes to the target, or, when the original names ``ServiceControl.RetryTo``
(a proxy), to that address with ``ServiceControl.TargetEndpointAddress`` carrying the target
(``retry_route``).

Addresses: NServiceBus addresses have the form ``queue@machine`` (MSMQ) or just ``queue``
(RabbitMQ, SQL transports). A broker queue has no machine, so the broker queue of an
address is the part before the first ``@`` (``queue_of_address``); the full address is
kept in ``ServiceControl.TargetEndpointAddress``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controlroom.errors.ingest import headers as h
from controlroom.errors.model import Headers
from controlroom.transport.base import check_queue_name
from controlroom.transport.properties import (
    MessageProperties,
    message_properties,
    parse_properties,
)

# --- header names (ServiceControl retries) ------------------------------------------------
RETRY_UNIQUE_MESSAGE_ID = h.RETRY_UNIQUE_MESSAGE_ID
RETRY_SUCCESSFUL = h.RETRY_SUCCESSFUL
RETRY_ATTEMPT_MESSAGE_ID = "ServiceControl.Retry.Attempt.MessageId"
RETRY_ACKNOWLEDGEMENT_QUEUE = "ServiceControl.Retry.AcknowledgementQueue"
TARGET_ENDPOINT_ADDRESS = "ServiceControl.TargetEndpointAddress"
RETRY_TO = "ServiceControl.RetryTo"
EDIT_OF = "ServiceControl.EditOf"
TASK_PROPERTIES = "Controlroom.TaskQueue.Properties"
"""The broker properties and typed header table of a Python task's message
(docs/design.md "Python task queues"), which a retry restores."""

TASK_RETRY_HEADERS: tuple[str, ...] = (
    RETRY_UNIQUE_MESSAGE_ID,
    RETRY_ACKNOWLEDGEMENT_QUEUE,
    TARGET_ENDPOINT_ADDRESS,
    EDIT_OF,
)
"""The retry headers a retried task message carries in its typed table: those of this
retry, never an earlier one's."""

STRIPPED_HEADER_PREFIXES: tuple[str, ...] = (
    "NServiceBus.Retries",
    "NServiceBus.FailedQ",
    "NServiceBus.TimeOfFailure",
    "NServiceBus.ExceptionInfo.",
    "ServiceControl.EditOf",
    h.BODY_NOT_KEPT,  # why the failure came without its body: not the message's own
)
"""Headers removed from a retried or edited message: every header whose name starts with
one of these (ordinal, case-sensitive, as ServiceControl's ``HeaderFilter``)."""

# Headers an edit may not change. ServiceControl's ``EditFailedMessagesController`` list,
# plus the retry headers (docs/decisions.md "Edits lock the identity and retry headers").
LOCKED_HEADERS: tuple[str, ...] = (
    "NServiceBus.MessageId",
    "NServiceBus.SagaId",
    "NServiceBus.CorrelationId",
    "NServiceBus.ControlMessage",
    "NServiceBus.OriginatingSagaId",
    "NServiceBus.RelatedTo",
    "NServiceBus.ConversationId",
    "NServiceBus.MessageIntent",
    "NServiceBus.Version",
    "NServiceBus.IsSagaTimeoutMessage",
    "NServiceBus.IsDeferredMessage",
    "NServiceBus.Retries",
    "NServiceBus.Retries.Timestamp",
    "NServiceBus.FLRetries",
    "NServiceBus.ProcessingStarted",
    "NServiceBus.ProcessingEnded",
    "NServiceBus.ExceptionInfo.ExceptionType",
    "NServiceBus.ExceptionInfo.HelpLink",
    "NServiceBus.ExceptionInfo.Message",
    "NServiceBus.ExceptionInfo.Source",
    "NServiceBus.ExceptionInfo.StackTrace",
    "NServiceBus.TimeOfFailure",
    "NServiceBus.FailedQ",
    RETRY_UNIQUE_MESSAGE_ID,
    RETRY_ATTEMPT_MESSAGE_ID,
    RETRY_ACKNOWLEDGEMENT_QUEUE,
    RETRY_SUCCESSFUL,
    TARGET_ENDPOINT_ADDRESS,
    EDIT_OF,
)

# Headers a console should warn about before an edit (ServiceControl's list).
SENSITIVE_HEADERS: tuple[str, ...] = (
    "NServiceBus.Header.RouteTo",
    "NServiceBus.DestinationSites",
    "NServiceBus.OriginatingSite",
    "NServiceBus.Header.HttpTo",
    "NServiceBus.ReplyToAddress",
    "NServiceBus.ReturnMessage.ErrorCode",
    "NServiceBus.SagaType",
    "NServiceBus.OriginatingSagaType",
    "NServiceBus.TimeSent",
    "Header",
)


class UnsendableMessage(ValueError):
    """A stored failed message cannot be sent again for a reason of its own (no queue in
    its address, unreadable headers, missing body, a body that was not kept). ``reason``
    names the part at fault and may quote the message; ``summary`` says it without
    quoting anything of the message (for the event log)."""

    def __init__(self, reason: str, summary: str = "it cannot be sent as stored") -> None:
        super().__init__(reason)
        self.reason = reason
        self.summary = summary


def check_body_kept(headers: Headers, body: bytes) -> None:
    """Raise ``UnsendableMessage`` when the message's body was not kept: it is empty and
    ``Controlroom.TaskQueue.BodyNotKept`` says why (a Python task's body too large to send
    with its failure), as the console and the API tell; a retry would send an empty task
    message. A body that was stored is sent, whatever the header says. An edit is not
    refused: the operator gives the body."""
    why = h.body_not_kept(headers)
    if why is not None and not body:
        raise UnsendableMessage(f"the body was not kept: {why}", "its body was not kept")


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """What a retry or an edited copy publishes besides its body: string ``headers``,
    ``message_id`` and ``content_type`` properties, and the further broker
    ``properties`` of a Python task's message (``None`` for any other message)."""

    headers: dict[str, str | None]
    message_id: str | None
    content_type: str | None
    properties: MessageProperties | None = None


def outgoing_message(outgoing: Headers, *, content_type: str | None = None) -> OutgoingMessage:
    """The message a retry sends, from its headers (``retry_headers`` or
    ``edited_message_headers``); ``content_type`` when the headers name none.

    A message whose headers carry ``Controlroom.TaskQueue.Properties`` is a Python task's
    (docs/design.md "Python task queues"): it goes out as its producer sent it, with
    those properties and that typed header table, plus this retry's ``TASK_RETRY_HEADERS``
    (an earlier retry's are dropped from the table); the failed message's own headers
    stay behind. Its message id is the one of its properties, else the
    ``NServiceBus.MessageId`` header (the task id). Any other message goes out with its
    string headers.

    Raises ``UnsendableMessage`` when the properties header does not parse.
    """
    message_id = h.header_text(outgoing, h.MESSAGE_ID)
    stored_type = h.header_text(outgoing, h.CONTENT_TYPE) or content_type
    text = outgoing.get(TASK_PROPERTIES)
    if text is None:
        return OutgoingMessage(dict(outgoing), message_id, stored_type)
    try:
        parsed: dict[str, Any] = parse_properties(text, header=TASK_PROPERTIES)
        table = dict(parsed.get("headers") or {})
        for name in TASK_RETRY_HEADERS:
            table.pop(name, None)
            if outgoing.get(name) is not None:
                table[name] = outgoing[name]
        properties = message_properties({**parsed, "headers": table})
    except ValueError as exc:
        raise UnsendableMessage(
            f"{TASK_PROPERTIES} does not parse: {exc}", "its task properties do not parse"
        ) from exc
    return OutgoingMessage(
        headers={},
        message_id=parsed.get("message_id") or message_id,
        content_type=parsed.get("content_type") or stored_type,
        properties=properties,
    )


def queue_of_address(address: str) -> str:
    """The broker queue of an NServiceBus address: the part before the first ``@``.

    Raises ``UnsendableMessage`` when that part is not a valid queue name (empty, longer
    than 255 bytes of UTF-8).
    """
    queue = h.split_address(address)[0]
    try:
        check_queue_name(queue)
    except ValueError as exc:
        raise UnsendableMessage(
            f"address {address[:100]!r} names no usable queue: {exc}",
            "its address names no usable queue",
        ) from exc
    return queue


def retry_route(headers: Headers, target: str) -> tuple[str, str | None]:
    """``(address to send to, ServiceControl.TargetEndpointAddress or None)`` of a retry
    whose target (failed queue, or its redirect) is ``target``: through the proxy named by
    ``ServiceControl.RetryTo`` (not blank) with the target in the header, else straight to
    the target without it. Source: ServiceControl ``ReturnToSender``."""
    retry_to = h.header_text(headers, RETRY_TO)
    if retry_to is not None:
        return retry_to, target
    return target, None


def strip_failure_headers(headers: Headers) -> dict[str, str | None]:
    """``headers`` without those matching ``STRIPPED_HEADER_PREFIXES``; order kept."""
    return {
        name: value
        for name, value in headers.items()
        if not name.startswith(STRIPPED_HEADER_PREFIXES)
    }


def retry_headers(
    stored: Headers,
    *,
    unique_message_id: str,
    acknowledgement_queue: str,
    target_endpoint_address: str | None,
) -> dict[str, str | None]:
    """The headers of a retried message, as the endpoint receives it.

    The stored headers without the failure headers and without
    ``ServiceControl.Retry.Attempt.MessageId`` / ``ServiceControl.TargetEndpointAddress``
    of an earlier retry, plus ``ServiceControl.Retry.UniqueMessageId`` (the failed
    message's id: a new failure lands on the same row) and
    ``ServiceControl.Retry.AcknowledgementQueue`` (where the endpoint confirms success:
    Controlroom's error queue); ``ServiceControl.TargetEndpointAddress`` only when the
    retry goes through a ``RetryTo`` proxy (``retry_route``). Source: ServiceControl
    ``ReturnToSender``.
    """
    headers = strip_failure_headers(stored)
    headers.pop(RETRY_ATTEMPT_MESSAGE_ID, None)
    headers.pop(TARGET_ENDPOINT_ADDRESS, None)
    headers[RETRY_UNIQUE_MESSAGE_ID] = unique_message_id
    headers[RETRY_ACKNOWLEDGEMENT_QUEUE] = acknowledgement_queue
    if target_endpoint_address is not None:
        headers[TARGET_ENDPOINT_ADDRESS] = target_endpoint_address
    return headers


def edited_message_headers(
    edited: Headers,
    *,
    original_id: str,
    new_message_id: str,
    edit_id: str,
    acknowledgement_queue: str,
    target_endpoint_address: str | None,
) -> dict[str, str | None]:
    """The headers of an edited copy of failed message ``original_id``.

    The operator's headers without the failure headers, with a new ``NServiceBus.
    MessageId``, ``ServiceControl.EditOf`` naming the original, and the retry headers
    under the edit's own id (``edit_id``): a failure of the copy is a new failed message,
    linked to the original by ``EditOf``. Source: ServiceControl ``EditHandler``.
    """
    headers = retry_headers(
        edited,
        unique_message_id=edit_id,
        acknowledgement_queue=acknowledgement_queue,
        target_endpoint_address=target_endpoint_address,
    )
    headers[h.MESSAGE_ID] = new_message_id
    headers[EDIT_OF] = original_id
    return headers


def locked_header_changes(original: Headers, edited: Headers) -> list[str]:
    """The locked headers the original has (not empty) whose value an edit changes or
    removes, sorted. Adding a locked header the original lacked is no change: ServiceControl's
    ``LockedHeaderModificationValidator`` (``None`` and ``""`` count as absent)."""
    return sorted(
        name
        for name in LOCKED_HEADERS
        if original.get(name) and original.get(name) != (edited.get(name) or None)
    )


def confirmation_headers(
    unique_message_id: str, message_id: str, processed_at: datetime
) -> dict[str, str | None]:
    """The headers of the control message that confirms a successful retry.

    ``ServiceControl.Retry.Successful`` (the time, NServiceBus wire format, UTC),
    ``ServiceControl.Retry.UniqueMessageId``, ``NServiceBus.ControlMessage``, and a new
    ``NServiceBus.MessageId``; the body is empty. Source: NServiceBus's retry
    acknowledgement, read by the ingestion's ``is_retry_confirmation``.
    """
    return {
        h.MESSAGE_ID: message_id,
        h.CONTROL_MESSAGE: "True",
        RETRY_SUCCESSFUL: format_nsb_time(processed_at),
        RETRY_UNIQUE_MESSAGE_ID: unique_message_id,
    }


def format_nsb_time(instant: datetime) -> str:
    """``yyyy-MM-dd HH:mm:ss:ffffff Z`` in UTC (the NServiceBus wire format).

    Raises ``ValueError`` for a naive ``datetime``.
    """
    if instant.tzinfo is None:
        raise ValueError("an NServiceBus wire time needs a timezone-aware datetime")
    utc = instant.astimezone(UTC)
    # Not %Y: strftime writes a year before 1000 with fewer than four digits.
    return f"{utc.year:04d}-{utc:%m-%d %H:%M:%S:%f} Z"
