"""Dramatiq failures into Controlroom: ``broker.add_middleware(ControlroomMiddleware())``.

Source: docs/design.md "Python task queues"; the choices are docs/decisions.md "Dramatiq:
the failure is reported where Dramatiq rejects the message", "Dramatiq: the worker reads
the delivery's AMQP properties through a tap on the broker's consumer" and "Dramatiq: a
retry that succeeds is confirmed before Dramatiq acknowledges it".

Where Dramatiq gives up on a message it rejects it (``before_nack``: retries exhausted,
an exception the actor ``throws``, a hard time limit once retries are exhausted, an age
limit, an unknown actor) and RabbitMQ dead-letters it to the queue's ``.XQ``. There this
middleware first publishes one failed message to Controlroom's error queue, with
publisher confirms, on a connection of its own per thread: the body the worker consumed,
byte for byte, and the failure as text (``envelope``). A body Dramatiq cannot decode is
rejected by its consumer with no middleware hook; the tap reports it the same way. A
retried message (``ServiceControl.Retry.*`` in its AMQP headers, which the tap reads)
that succeeds is confirmed to the acknowledgement queue before Dramatiq acknowledges it;
one that fails again carries the retry's id, so it folds into the same failed message.

When the error queue cannot be reached the failure is logged whole at ERROR and Dramatiq
goes on as without the middleware: the message is dead-lettered to ``.XQ`` (or, with
the broker down, redelivered later, and reported then).

A worker process that dies holding a message (a segfault, an out-of-memory kill) makes
RabbitMQ redeliver it. The tap does not hand a redelivered message to the worker: it
publishes it again with ``Controlroom.TaskQueue.Redeliveries`` one higher and
acknowledges it; at ``max_worker_deaths`` it hands it over marked failed with
``controlroom.integrations.WorkerDied``, which Dramatiq rejects unrun and this middleware
reports (docs/decisions.md "A task that kills its worker is counted in the message and
reported at a limit"). A delay queue's message is not counted.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dramatiq
import pika
import pika.exceptions
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import q_name
from dramatiq.encoder import JSONEncoder
from dramatiq.errors import DecodeError
from dramatiq.message import Message, get_encoder

from controlroom.errors.ingest import headers as h
from controlroom.errors.retries import wire as retry_wire
from controlroom.integrations import WorkerDied, envelope

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""A consumed body larger than this is not sent to the error queue: the failure is, with
``Controlroom.TaskQueue.BodyNotKept`` saying why (RabbitMQ refuses messages above its
``max_message_size``, 128 MiB by default)."""

LOGGED_BODY_BYTES = 64 * 1024
"""How much of a body an ERROR line carries when the failure could not be sent."""

_STRIPPED_HEADER_PREFIXES = ("ServiceControl.", "NServiceBus.", "$.diagnostics.", "Controlroom.")
"""Headers of a delivery that Controlroom's retry added (a Dramatiq producer sets no AMQP
headers): not part of the task message's own header table."""

_PRECONDITION_FAILED = 406  # AMQP's reply code for a message over max_message_size

RETRY_OPTION = "controlroom_retry"
"""The message option that carries a Controlroom retry's ids through a retry Dramatiq
enqueues itself (its own re-enqueue sets no AMQP headers): ``{"unique_message_id",
"acknowledgement_queue"}``."""

_DELIVERY = "_controlroom_delivery"
_SUCCEEDED = "_controlroom_succeeded"
_REPORTED = "_controlroom_reported"


@dataclass(frozen=True)
class Delivery:
    """What the tap saw of one delivery: the body as consumed, the AMQP properties,
    ``retries`` (Dramatiq's count in the message's options before this run) and, for a
    Controlroom retry, its ``retry_id`` and ``acknowledgement_queue``."""

    body: bytes
    properties: pika.BasicProperties
    retries: int
    retry_id: str | None = None
    acknowledgement_queue: str | None = None

    @classmethod
    def of(cls, body: bytes, properties: pika.BasicProperties, options: Any) -> Delivery:
        """The delivery of a message with ``options``: the retry's ids from its AMQP
        headers, else from ``RETRY_OPTION`` (a retry Dramatiq enqueued again itself)."""
        options = options if isinstance(options, dict) else {}
        retries = options.get("retries", 0)
        retry_id = _header(properties, h.RETRY_UNIQUE_MESSAGE_ID)
        ack_queue = _header(properties, retry_wire.RETRY_ACKNOWLEDGEMENT_QUEUE)
        carried = options.get(RETRY_OPTION)
        if retry_id is None and isinstance(carried, dict):
            retry_id = _text(carried.get("unique_message_id"))
            ack_queue = _text(carried.get("acknowledgement_queue"))
        return cls(
            body=body,
            properties=properties,
            retries=retries if isinstance(retries, int) and retries >= 0 else 0,
            retry_id=retry_id,
            acknowledgement_queue=ack_queue,
        )


class ControlroomMiddleware(dramatiq.Middleware):
    """Reports the messages Dramatiq rejects to Controlroom's ``error_queue`` and confirms
    Controlroom's retries that succeed.

    ``endpoint`` is the processing endpoint the failures name (default: the queue the
    message was consumed from); ``url`` the broker of the error queue (default: the
    Dramatiq broker's own); ``max_body_bytes`` see ``DEFAULT_MAX_BODY_BYTES``;
    ``max_worker_deaths``: a message RabbitMQ redelivers after its worker process died
    holding it this many times is reported (``controlroom.integrations.WorkerDied``) and
    dead-lettered instead of run again (``envelope.DEFAULT_MAX_WORKER_DEATHS``; 0: never,
    it is redelivered for ever). Raises ``ValueError`` for a negative limit.
    """

    def __init__(
        self,
        error_queue: str = "error",
        endpoint: str | None = None,
        *,
        url: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_worker_deaths: int = envelope.DEFAULT_MAX_WORKER_DEATHS,
    ) -> None:
        if max_worker_deaths < 0:
            raise ValueError("max_worker_deaths must not be negative")
        self.max_worker_deaths = max_worker_deaths
        self.error_queue = error_queue
        self.endpoint = endpoint
        self.url = url
        self.max_body_bytes = max_body_bytes
        self.host = socket.gethostname()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: set[pika.BlockingConnection] = set()
        self._parameters: Any = None

    # --- installing the tap ---------------------------------------------------------------
    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        self._install(broker)

    def before_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        self._install(broker)

    def _install(self, broker: dramatiq.Broker) -> None:
        if self._parameters is None:
            self._parameters = (
                pika.URLParameters(self.url)
                if self.url is not None
                else getattr(broker, "parameters", None)
            )
        if not isinstance(broker, RabbitmqBroker) or getattr(broker, "_controlroom_tap", False):
            return
        consume = broker.consume

        def tapped_consume(queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
            return _TappedConsumer(consume(queue_name, prefetch, timeout), self)

        # The broker's consumer keeps only the decoded body; the failed message needs the
        # body as consumed and the retry headers (docs/decisions.md "Dramatiq: the worker
        # reads the delivery's AMQP properties through a tap on the broker's consumer").
        broker.consume = tapped_consume  # type: ignore[method-assign]
        broker._controlroom_tap = True  # type: ignore[attr-defined]

    # --- the hooks ------------------------------------------------------------------------
    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        delivery: Delivery | None = getattr(message, _DELIVERY, None)
        self._local.retried = (
            (message.message_id, delivery)
            if delivery is not None and delivery.retry_id is not None
            else None
        )

    def before_enqueue(self, broker: dramatiq.Broker, message: Message[Any], delay: int) -> None:
        retried: tuple[str, Delivery] | None = getattr(self._local, "retried", None)
        if retried is not None and retried[0] == message.message_id:
            # Dramatiq retries a Controlroom retry itself: the ids go along in the body
            # of Dramatiq's own re-enqueue, so its success is confirmed too
            # (docs/decisions.md "Dramatiq: a retry that succeeds is confirmed before
            # Dramatiq acknowledges it").
            message.options[RETRY_OPTION] = {
                "unique_message_id": retried[1].retry_id,
                "acknowledgement_queue": retried[1].acknowledgement_queue,
            }

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        if exception is None and not message.failed:
            setattr(message, _SUCCEEDED, True)

    def before_ack(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._local.retried = None
        delivery: Delivery | None = getattr(message, _DELIVERY, None)
        if delivery is None or not getattr(message, _SUCCEEDED, False):
            return
        unique_id, ack_queue = delivery.retry_id, delivery.acknowledgement_queue
        if unique_id is None or ack_queue is None:
            return
        try:
            queue = retry_wire.queue_of_address(ack_queue)
            self._publish(queue, envelope.confirmation_headers(unique_id), b"")
        except Exception:
            # The task ran: running it again would be worse than an unconfirmed retry,
            # which Controlroom shows as such.
            log.exception(
                "could not confirm Controlroom's retry %s of Dramatiq message %s to %r",
                unique_id,
                message.message_id,
                ack_queue,
            )
        setattr(message, _SUCCEEDED, False)

    def before_nack(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._local.retried = None
        if getattr(message, _REPORTED, False):
            return  # Dramatiq repeats the rejection after a connection error
        try:
            exception = message._exception or _Rejected(
                "Dramatiq rejected the message without an exception"
            )
            delivery: Delivery | None = getattr(message, _DELIVERY, None)
            if delivery is not None:
                body, retries, properties = delivery.body, delivery.retries, delivery
            else:  # not a RabbitMQ delivery seen by the tap: the broker's encoding
                body, retries, properties = message.encode(), _retries(message), None
            self.report(
                task_id=message.message_id,
                task_name=message.actor_name,
                queue=q_name(message.queue_name),
                body=body,
                exception=exception,
                retries=retries,
                time_sent=_time_of(message.message_timestamp),
                delivery=properties,
            )
        except Exception:
            log.exception("could not build the failed message of Dramatiq message %r", message)
        setattr(message, _REPORTED, True)

    def before_worker_thread_shutdown(self, broker: dramatiq.Broker, thread: Any) -> None:
        self._close_thread_connection()

    def before_consumer_thread_shutdown(self, broker: dramatiq.Broker, thread: Any) -> None:
        self._close_thread_connection()

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        with self._lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            _close(connection)

    # --- reporting ------------------------------------------------------------------------
    def report(
        self,
        *,
        task_id: str,
        task_name: str,
        queue: str,
        body: bytes,
        exception: BaseException,
        retries: int,
        time_sent: datetime | None,
        delivery: Delivery | None,
        decoded: bool = True,
    ) -> bool:
        """Publish one failed message (confirmed); True when the broker confirmed it,
        False when it could not be sent (logged whole at ERROR). ``decoded``: Dramatiq's
        encoder read the body (so it has the encoder's content type)."""
        body_not_kept = None
        if len(body) > self.max_body_bytes:
            body_not_kept = (
                f"the task message's body of {len(body)} bytes is larger than the "
                f"integration's max_body_bytes ({self.max_body_bytes})"
            )
        headers = envelope.failed_message_headers(
            kind=envelope.DRAMATIQ,
            task_id=task_id,
            task_name=task_name,
            queue=queue,
            endpoint=self.endpoint or queue,
            host=self.host,
            failure=envelope.capture_failure(exception),
            time_of_failure=datetime.now(UTC),
            time_sent=time_sent,
            retries=retries,
            content_type=_content_type(delivery, decoded),
            properties=_properties(delivery),
            retry_unique_message_id=delivery.retry_id if delivery is not None else None,
            body_not_kept=body_not_kept,
        )
        sent = b"" if body_not_kept else body
        try:
            try:
                self._publish(self.error_queue, headers, sent)
            except pika.exceptions.ChannelClosedByBroker as refused:
                if refused.reply_code != _PRECONDITION_FAILED or not sent:
                    raise
                # The broker refuses a message larger than its max_message_size: the
                # failure still goes, without the body, saying why.
                headers[envelope.BODY_NOT_KEPT] = (
                    f"the broker refused the failed message with the task message's body "
                    f"of {len(body)} bytes: {refused.reply_text}"
                )
                self._publish(self.error_queue, headers, b"")
            return True
        except Exception as exc:
            log.error(
                "could not send the failure of Dramatiq message %s to Controlroom's error "
                "queue %r (%s: %s); Dramatiq dead-letters the message to %s.XQ (or, with "
                "the broker down, gets it again and reports it then). The failed "
                "message: headers %s body (%d bytes) %r",
                task_id,
                self.error_queue,
                type(exc).__name__,
                exc,
                queue,
                json.dumps(headers, ensure_ascii=False),
                len(body),
                body[:LOGGED_BODY_BYTES],
            )
            return False

    def report_undecodable(self, queue: str, delivery: Delivery) -> None:
        """Report a body Dramatiq's consumer could not decode (it rejects it itself)."""
        try:
            Message.decode(delivery.body)
        except DecodeError as exc:
            error: BaseException = exc
        else:  # decodes here: the failure was elsewhere, still a rejection
            error = _Rejected("Dramatiq's consumer could not decode the message")
        digest = hashlib.sha256(delivery.body).hexdigest()[:32]
        self.report(
            task_id=delivery.properties.message_id or f"undecodable-{digest}",
            task_name="(undecodable Dramatiq message)",
            queue=q_name(queue),
            body=delivery.body,
            exception=error,
            retries=0,
            time_sent=None,
            delivery=delivery,
            decoded=False,
        )

    def redelivered(self, queue_name: str, message: MessageProxy) -> MessageProxy | None:
        """What the consumer hands the worker for ``message``, which RabbitMQ redelivered
        (a worker holding it died or lost its connection): ``message`` itself when it is
        not counted (a delay queue's message waits, never runs) or could not be published
        again (logged; it runs, as without the count); ``message`` marked failed with
        ``WorkerDied`` at ``max_worker_deaths`` (Dramatiq skips the actor and rejects it,
        so ``before_nack`` reports it); else None: the message went back to its queue
        with one more death counted, confirmed, and this delivery is to be acknowledged
        unrun (docs/decisions.md "A task that kills its worker is counted in the message
        and reported at a limit")."""
        delivery: Delivery | None = getattr(message, _DELIVERY, None)
        if delivery is None or q_name(queue_name) != queue_name or "eta" in message.options:
            return message
        deaths = envelope.redeliveries(delivery.properties.headers) + 1
        if deaths >= self.max_worker_deaths:
            message.fail()
            message.stuff_exception(WorkerDied(deaths))
            return message
        properties = copy.copy(delivery.properties)
        properties.headers = {**(properties.headers or {}), envelope.REDELIVERIES: deaths}
        try:
            self._publish_properties(queue_name, properties, delivery.body)
        except Exception:
            log.exception(
                "could not publish Dramatiq message %s again with its worker deaths "
                "counted (%d); it runs again uncounted",
                message.message_id,
                deaths,
            )
            return message
        return None

    def _publish(self, queue: str, headers: Mapping[str, str | None], body: bytes) -> None:
        """Publish persistent with publisher confirms on this thread's connection."""
        properties = pika.BasicProperties(
            delivery_mode=2,
            headers={name: value for name, value in headers.items() if value is not None},
        )
        self._publish_properties(queue, properties, body)

    def _publish_properties(
        self, queue: str, properties: pika.BasicProperties, body: bytes
    ) -> None:
        """Publish with publisher confirms on this thread's connection; one more try on a
        fresh connection when the kept one was lost (an idle blocking connection misses
        its heartbeats)."""
        for attempt in (1, 2):
            channel = self._channel()
            try:
                channel = self._ensure_queue(channel, queue)
                channel.basic_publish("", queue, body, properties, mandatory=True)
                return
            except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError):
                self._close_thread_connection()
                if attempt == 2:
                    raise

    def _channel(self) -> Any:
        channel = getattr(self._local, "channel", None)
        if channel is not None and channel.is_open:
            return channel
        self._close_thread_connection()
        connection = pika.BlockingConnection(self._parameters)
        with self._lock:
            self._connections.add(connection)
        channel = connection.channel()
        channel.confirm_delivery()
        self._local.connection, self._local.channel = connection, channel
        self._local.declared = set()
        return channel

    def _ensure_queue(self, channel: Any, queue: str) -> Any:
        """Make sure ``queue`` exists as Controlroom's transport does: passive declare,
        else declare it durable without arguments (once per connection); returns the
        channel to publish on (a refused passive declare closes the channel)."""
        declared: set[str] = self._local.declared
        if queue in declared:
            return channel
        try:
            channel.queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
            channel = self._reopen_channel()
            channel.queue_declare(queue, durable=True)
        declared.add(queue)
        return channel

    def _reopen_channel(self) -> Any:
        channel = self._local.connection.channel()
        channel.confirm_delivery()
        self._local.channel = channel
        return channel

    def _close_thread_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = self._local.channel = None
        if connection is not None:
            with self._lock:
                self._connections.discard(connection)
            _close(connection)


class _TappedConsumer(Consumer):
    """The broker's RabbitMQ consumer, keeping each delivery's body and properties on the
    message it returns, and reporting a body it cannot decode before it rejects it (the
    rejection is sent on the consumer's next step, after this)."""

    def __init__(self, inner: Any, middleware: ControlroomMiddleware) -> None:
        self.inner = inner
        self.middleware = middleware
        self.last: tuple[Any, Any, bytes] | None = None
        inner.iterator = self._record(inner.iterator)

    def _record(self, iterator: Iterator[Any]) -> Iterator[Any]:
        for item in iterator:
            self.last = item
            yield item

    def __next__(self) -> MessageProxy | None:
        self.last = None
        message: MessageProxy | None = self.inner.__next__()
        if self.last is None or self.last[0] is None:
            return message
        _method, properties, body = self.last
        if message is None:  # the consumer rejected a body it could not decode
            self.middleware.report_undecodable(
                self.inner.queue_name, Delivery.of(body, properties, None)
            )
            return None
        setattr(message, _DELIVERY, Delivery.of(body, properties, message.options))
        if getattr(message, "redelivered", False) and self.middleware.max_worker_deaths:
            handed = self.middleware.redelivered(self.inner.queue_name, message)
            if handed is None:  # back on its queue, counted: this delivery is done
                self.inner.ack(message)
            return handed
        return message

    def ack(self, message: MessageProxy) -> None:
        self.inner.ack(message)

    def nack(self, message: MessageProxy) -> None:
        self.inner.nack(message)

    def requeue(self, messages: Any) -> None:
        self.inner.requeue(messages)

    def close(self) -> None:
        self.inner.close()


class _Rejected(Exception):
    """A rejection that came with no exception of its own."""


def _header(properties: pika.BasicProperties, name: str) -> str | None:
    return _text((properties.headers or {}).get(name))


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return None if value is None else str(value)


def _retries(message: MessageProxy) -> int:
    retries = message.options.get("retries", 0)
    return retries if isinstance(retries, int) and retries >= 0 else 0


def _time_of(timestamp: object) -> datetime | None:
    if not isinstance(timestamp, int | float) or isinstance(timestamp, bool):
        return None
    try:
        return datetime.fromtimestamp(timestamp / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _content_type(delivery: Delivery | None, decoded: bool) -> str | None:
    """The producer's AMQP content type, else ``application/json`` for a body Dramatiq's
    JSON encoder decoded; else none (ingestion keeps the body as binary)."""
    if delivery is not None and delivery.properties.content_type:
        return str(delivery.properties.content_type)
    return "application/json" if decoded and isinstance(get_encoder(), JSONEncoder) else None


def _properties(delivery: Delivery | None) -> dict[str, Any] | None:
    """The delivery's broker properties (``envelope.PROPERTY_NAMES``), without the headers
    Controlroom's retry added; None when nothing is left or a header has no JSON form."""
    if delivery is None:
        return None
    p = delivery.properties
    headers = {
        name: value
        for name, value in (p.headers or {}).items()
        if not name.startswith(_STRIPPED_HEADER_PREFIXES)
    }
    properties = {
        "content_type": p.content_type,
        "content_encoding": p.content_encoding,
        "correlation_id": p.correlation_id,
        "reply_to": p.reply_to,
        "priority": p.priority,
        "message_id": p.message_id,
        "headers": headers or None,
    }
    try:
        envelope.properties_json(properties)
    except ValueError:
        log.warning("a header of a Dramatiq message has no JSON form; its headers are not kept")
        properties["headers"] = None
    return properties if any(v is not None for v in properties.values()) else None


def _close(connection: Any) -> None:
    try:
        if connection.is_open:
            connection.close()
    except Exception:  # closing a broken connection: nothing left to do
        log.debug("closing a connection to the error queue's broker failed", exc_info=True)
