"""Publishing failed messages to Controlroom's intake, for producers and tools.

A producer that is not NServiceBus (a Python service, a bridge, ``controlroom demo``)
puts a failed message on the error queue with NServiceBus headers (see
``controlroom.errors.ingest.headers`` and docs/design.md "Wire contract"); Controlroom ingests it
like one NServiceBus moved there. Nothing here validates the headers: a message missing
a required header is kept by ingestion as a failed import, which is the point of sending
it rather than refusing it at the door.

Async use, many messages over one connection::

    async with open_transport(settings) as transport:
        await publish_failed_message(transport, headers, body, error_queue=settings.error_queue)

Sync use, one message::

    send_failed_message(settings, headers, body)

The consumer side, an endpoint reading its own queue (where Controlroom sends the retries
of the messages that failed in it), does what an NServiceBus endpoint does: after it
processed a message it confirms the retry, and the failed message becomes Resolved; when
processing fails it moves the message to the error queue with the failure headers, and
the failed message (the same one: the retry headers stay) is Unresolved again with one more
attempt. Either way it acknowledges the message afterwards::

    async for delivery in transport.consume("Sales", prefetch=10):
        try:
            handle(delivery.body)
        except Exception as exc:
            await move_to_error_queue(
                transport, delivery.headers, delivery.body, exc, failed_queue="Sales"
            )
        else:
            await confirm_successful_retry(transport, delivery.headers)
        await delivery.ack()

The README has the whole program; ``controlroom demo endpoints`` plays such endpoints.
"""

from __future__ import annotations

import asyncio
import socket
import traceback
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from controlroom.config import Settings
from controlroom.errors.ingest import headers as h
from controlroom.errors.retries import wire as retry_wire
from controlroom.transport import Transport, create_transport


@asynccontextmanager
async def open_transport(settings: Settings) -> AsyncIterator[Transport]:
    """The transport ``settings`` configure (RabbitMQ, else the embedded queue), started,
    and closed on exit.

    Raises ``TransportError`` when the broker or queue file cannot be reached.
    """
    transport = create_transport(settings)
    await transport.start()
    try:
        yield transport
    finally:
        await transport.close()


async def publish_failed_message(
    transport: Transport,
    headers: Mapping[str, str | None],
    body: bytes,
    *,
    error_queue: str = "error",
) -> None:
    """Put one failed message (``headers`` as NServiceBus writes them, ``body`` the exact
    bytes) on ``error_queue``; returns once the transport has durably accepted it.

    The message-id and content-type properties come from ``NServiceBus.MessageId`` and
    ``NServiceBus.ContentType``, as NServiceBus's RabbitMQ transport sets them. Raises
    ``ValueError`` for a bad queue name or a header that is not text, ``TransportError``
    when the message may not have been accepted (publishing again is safe: ingestion
    folds a repeated attempt).
    """
    await transport.publish(
        error_queue,
        headers,
        body,
        message_id=h.header_text(headers, h.MESSAGE_ID),
        content_type=h.header_text(headers, h.CONTENT_TYPE),
    )


def send_failed_message(settings: Settings, headers: Mapping[str, str | None], body: bytes) -> None:
    """Connect, publish one failed message to ``settings.error_queue``, disconnect.

    For scripts and synchronous code; it runs its own event loop, so it must not be
    called from a running one (``RuntimeError``). Raises as ``publish_failed_message``.
    """
    asyncio.run(_send_one(settings, headers, body))


async def _send_one(settings: Settings, headers: Mapping[str, str | None], body: bytes) -> None:
    async with open_transport(settings) as transport:
        await publish_failed_message(transport, headers, body, error_queue=settings.error_queue)


async def confirm_successful_retry(
    transport: Transport,
    headers: Mapping[str, str | None],
    *,
    processed_at: datetime | None = None,
) -> bool:
    """Tell Controlroom that a retried message was processed successfully.

    ``headers`` are the headers of the message as the consumer received it. When they
    carry ``ServiceControl.Retry.UniqueMessageId`` and ``ServiceControl.Retry.
    AcknowledgementQueue`` (Controlroom's error queue), a control message with
    ``ServiceControl.Retry.Successful`` (``processed_at``, default now, UTC) goes to that
    queue, and ingestion marks the failed message Resolved. Returns ``True`` when a
    confirmation was sent, ``False`` for a message that is not a retry (so a consumer
    may call it after every message), as NServiceBus endpoints do. Call it after the
    message's work is committed, before acknowledging the message.

    Raises ``TransportError`` when the confirmation may not have been accepted (sending
    it again is harmless: a second confirmation changes nothing).
    """
    unique_message_id = h.header_text(headers, retry_wire.RETRY_UNIQUE_MESSAGE_ID)
    queue = h.header_text(headers, retry_wire.RETRY_ACKNOWLEDGEMENT_QUEUE)
    if unique_message_id is None or queue is None:
        return False
    message_id = str(uuid.uuid4())
    confirmation = retry_wire.confirmation_headers(
        unique_message_id, message_id, processed_at or datetime.now(UTC)
    )
    await transport.publish(queue, confirmation, b"", message_id=message_id)
    return True


async def move_to_error_queue(
    transport: Transport,
    headers: Mapping[str, str | None],
    body: bytes,
    exception: BaseException,
    *,
    failed_queue: str,
    error_queue: str = "error",
    processing_endpoint: str | None = None,
    time_of_failure: datetime | None = None,
) -> dict[str, str | None]:
    """Move a message the consumer could not process to ``error_queue``, as NServiceBus's
    recoverability does once its own retries are spent; returns the headers sent.

    ``headers`` and ``body`` are the message as received (``body`` unchanged). The
    headers sent are those plus the failure headers: ``NServiceBus.FailedQ``
    (``failed_queue``, where a retry goes back to), ``NServiceBus.TimeOfFailure``
    (``time_of_failure``, default now, UTC), ``NServiceBus.ExceptionInfo.ExceptionType``
    (the exception's module and name), ``.Message``, ``.Source`` (its module) and
    ``.StackTrace`` (the formatted traceback), ``NServiceBus.ProcessingEndpoint``
    (``processing_endpoint``, default ``failed_queue``) and ``NServiceBus.ProcessingMachine``
    (this host). A retried message keeps ``ServiceControl.Retry.UniqueMessageId``, so
    Controlroom folds the failure into the same failed message as a new attempt.

    The exception's text may hold lone surrogates (bytes that were not UTF-8, as Python
    decodes a file name or an environment variable): they are sent as backslash escapes
    (``\\udcff``), since a header value must be UTF-8.

    Raises ``ValueError`` for a naive ``time_of_failure``, ``TransportError`` as
    ``publish_failed_message`` (moving it again is harmless: the same attempt is folded).
    """
    kind = type(exception)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    failed = dict(headers)
    failed.update(
        {
            h.FAILED_Q: failed_queue,
            h.TIME_OF_FAILURE: retry_wire.format_nsb_time(time_of_failure or datetime.now(UTC)),
            h.EXCEPTION_TYPE: name,
            h.EXCEPTION_MESSAGE: _header_text(str(exception)),
            h.EXCEPTION_SOURCE: kind.__module__,
            h.EXCEPTION_STACK_TRACE: _header_text("".join(traceback.format_exception(exception))),
            h.PROCESSING_ENDPOINT: processing_endpoint or failed_queue,
            h.PROCESSING_MACHINE: socket.gethostname(),
        }
    )
    await publish_failed_message(transport, failed, body, error_queue=error_queue)
    return failed


def _header_text(text: str) -> str:
    """``text`` as a header value can carry it: lone surrogates as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
