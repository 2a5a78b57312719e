"""RabbitMQ transport on aio-pika, wire-compatible with NServiceBus's RabbitMQ transport.

Connection recovery is aio-pika's robust layer (``connect_robust``): channels, QoS and
consumers are restored after a reconnect; nothing here loops on errors. What a caller
sees during an outage: ``publish`` raises ``TransportError`` (ambiguous: the broker may
have the message), settling a delivery received before the outage raises
``DeliveryLostError`` (the broker redelivers it), ``check`` raises until reconnected.

Queues: NServiceBus declares its queues itself (durable; classic or quorum, with
arguments of its own). Declaring an existing queue with different arguments fails, so
this module first declares passively (an existence check that never conflicts) and only
declares a missing queue, durable, without arguments.

Message id: NServiceBus puts the message id both in the AMQP ``message_id`` property
and in the ``NServiceBus.MessageId`` header. Headers are authoritative; the property
fills the header only when the header is absent (messages from other senders). Our
publishes always carry the property (``base.resolve_message_id``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import decimal
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from controlroom.transport import _amqp_names
from controlroom.transport.base import (
    CONTENT_ENCODING_HEADER,
    Delivery,
    DeliveryLostError,
    Headers,
    TransportClosedError,
    TransportError,
    check_prefetch,
    check_queue_name,
    fill_message_id,
    resolve_message_id,
    validate_headers,
)

log = logging.getLogger(__name__)

CONNECTION_NAME = "controlroom"

# Errors that mean "the connection or channel is gone or going": transient by nature.
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPConnectionError,
    aiormq.exceptions.ChannelClosed,
    aiormq.exceptions.ChannelInvalidStateError,
    ConnectionError,
)


@dataclass(eq=False)
class _Session:
    """One ``consume()`` call: its channel and consumer, the messages the broker pushed
    that were not yet yielded, and how many yielded deliveries are unsettled (the
    channel must stay open until they are, or they could not be acknowledged)."""

    channel: AbstractChannel
    queue: AbstractQueue | None = None
    consumer_tag: str | None = None
    # None is the stop signal put by close().
    buffer: asyncio.Queue[AbstractIncomingMessage | None] = field(default_factory=asyncio.Queue)
    outstanding: int = 0
    consuming: bool = True

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        self.buffer.put_nowait(message)


MAX_FIELD_NAME_BYTES = 128
"""Longest header name AMQP carries whole (pamqp truncates longer ones when encoding)."""

_amqp_names.install()  # non-UTF-8 names become failed imports, not dropped connections


class RabbitMQTransport:
    """Transport over the RabbitMQ broker at ``url`` (``amqp://user:pass@host:port/vhost``).

    Publishes go to the default exchange with routing key = queue name, persistent,
    with publisher confirms; each ``consume()`` gets its own channel with
    ``basic.qos(prefetch)``. ``publish_timeout_seconds`` bounds the wait for a confirm
    (a broker under a resource alarm blocks publishers indefinitely).
    """

    def __init__(self, url: str, *, publish_timeout_seconds: float = 60.0) -> None:
        if publish_timeout_seconds <= 0:
            raise ValueError("publish_timeout_seconds must be positive")
        self._url = url
        self._publish_timeout = float(publish_timeout_seconds)
        self._connection: AbstractRobustConnection | None = None
        self._publish_channel: AbstractChannel | None = None
        self._sessions: set[_Session] = set()
        self._known_queues: set[str] = set()  # declared on this connection
        # One queue declaration at a time: probe channels opened concurrently race for a
        # channel number and the broker closes the whole connection ("second
        # 'channel.open' seen"; issue 14, item 9).
        self._declaring = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"RabbitMQTransport({redact_url(self._url)!r})"

    async def __aenter__(self) -> RabbitMQTransport:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (first attempt only; later losses are recovered by aio-pika).

        Raises ``TransportError`` when the broker cannot be reached or refuses the
        login; the message names the URL without its password.
        """
        if self._closed:
            raise TransportClosedError(f"{self!r} is closed")
        if self._connection is not None:
            return
        try:
            connection = await aio_pika.connect_robust(
                self._url, client_properties={"connection_name": CONNECTION_NAME}
            )
        except (aiormq.exceptions.AMQPError, OSError) as exc:
            if _refused_open(exc):
                raise TransportError(_vhost_refusal(self._url)) from exc
            raise TransportError(f"cannot connect to {redact_url(self._url)}: {exc!r}") from exc
        try:
            # on_return_raises: a message the broker cannot route (queue deleted) fails
            # the publish instead of vanishing.
            self._publish_channel = await connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
        except BaseException:
            await connection.close()
            raise
        self._connection = connection

    async def close(self) -> None:
        """Cancel consumers and close the connection; the broker requeues every
        unacknowledged delivery. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for session in list(self._sessions):
            session.buffer.put_nowait(None)  # ends the consume() loop
            await _close_session(session)
        self._sessions.clear()
        if self._connection is not None:
            with contextlib.suppress(*_CONNECTION_ERRORS):
                await self._connection.close()

    async def check(self) -> None:
        """Raise ``TransportError`` unless connected (false while aio-pika reconnects)."""
        connection = self._require_connection()
        if connection.is_closed or not connection.connected.is_set():
            raise TransportError(f"not connected to {redact_url(self._url)}")
        if self._publish_channel is None or self._publish_channel.is_closed:
            raise TransportError("the publish channel is closed")

    # -- producer side ---------------------------------------------------------------

    async def publish(
        self,
        queue: str,
        headers: Mapping[str, str | None],
        body: bytes,
        *,
        message_id: str | None = None,
        content_type: str | None = None,
    ) -> None:
        """Publish persistently to ``queue`` via the default exchange; returns after
        the broker's publisher confirm (the message is on disk or replicated).

        The queue is declared durable first when it does not exist. Raises
        ``ValueError`` for bad input, ``TransportError`` when the broker nacks, cannot
        route, does not confirm within ``publish_timeout_seconds``, or the connection
        fails (the last two leave the outcome unknown: a retry may duplicate the
        message). During a connection outage it fails at once rather than waiting for
        the reconnect.
        """
        check_queue_name(queue)
        if not isinstance(body, bytes | bytearray | memoryview):
            raise ValueError(f"body must be bytes, not {type(body).__name__}")
        valid = validate_headers(headers)
        for name in valid:
            size = len(name.encode("utf-8"))
            if size > MAX_FIELD_NAME_BYTES:
                raise ValueError(
                    f"header name {name[:60]!r}... is {size} bytes of UTF-8; AMQP field names "
                    f"hold at most {MAX_FIELD_NAME_BYTES} (it would be cut short)"
                )
        message = aio_pika.Message(
            bytes(body),
            headers=dict(valid),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=resolve_message_id(valid, message_id),
            content_type=content_type,
        )
        channel = self._require_publish_channel()
        await self._ensure_queue(queue)
        try:
            try:
                await self._publish_confirmed(channel, message, queue)
            except aiormq.exceptions.PublishError:
                # Returned unroutable: the queue was deleted since we declared it.
                self._known_queues.discard(queue)
                await self._ensure_queue(queue)
                await self._publish_confirmed(channel, message, queue)
        except aiormq.exceptions.DeliveryError as exc:
            raise TransportError(
                f"the broker did not accept the message for {queue!r}: {exc}"
            ) from exc
        except TimeoutError as exc:
            raise TransportError(
                f"no publisher confirm for {queue!r} within {self._publish_timeout} s; "
                "outcome unknown"
            ) from exc
        except (*_CONNECTION_ERRORS, RuntimeError) as exc:
            # RuntimeError: aio-pika's word for a channel or connection it has closed.
            raise TransportError(f"publish to {queue!r} failed, outcome unknown: {exc!r}") from exc

    async def _publish_confirmed(
        self, channel: AbstractChannel, message: aio_pika.Message, queue: str
    ) -> None:
        # mandatory: an unroutable message comes back as PublishError (on_return_raises)
        # instead of being dropped by the default exchange.
        await channel.default_exchange.publish(
            message, routing_key=queue, mandatory=True, timeout=self._publish_timeout
        )

    async def purge(self, queue: str) -> int:
        """Delete the ready messages of ``queue`` (unacked ones stay); returns the
        count. Declares the queue when missing."""
        check_queue_name(queue)
        await self._ensure_queue(queue)
        try:
            async with self._probe() as channel:
                amqp_queue = await channel.declare_queue(queue, passive=True)
                result = await amqp_queue.purge()
        except _CONNECTION_ERRORS as exc:
            raise TransportError(f"cannot purge {queue!r}: {exc!r}") from exc
        return int(result.message_count or 0)

    # -- consumer side ---------------------------------------------------------------

    async def consume(self, queue: str, prefetch: int) -> AsyncIterator[Delivery]:
        """Yield deliveries of ``queue`` in broker order, at most ``prefetch``
        unacknowledged (``basic.qos``). See ``Transport.consume``.

        When the iterator ends, the consumer is cancelled and pushed-but-unyielded
        messages are requeued; the channel stays open until every yielded delivery is
        settled, or ``close()``.
        """
        check_queue_name(queue)
        check_prefetch(prefetch)
        connection = self._require_connection()
        await self._ensure_queue(queue)
        try:
            channel = await connection.channel(publisher_confirms=False)
        except (*_CONNECTION_ERRORS, RuntimeError) as exc:  # RuntimeError: not connected
            raise TransportError(f"cannot open a channel to consume {queue!r}: {exc!r}") from exc
        session = _Session(channel)
        self._sessions.add(session)
        try:
            await _start_consumer(session, queue, prefetch)
            while (message := await session.buffer.get()) is not None:
                if not _channel_alive(message):
                    continue  # from before a reconnect: the broker redelivers it
                session.outstanding += 1
                yield self._delivery(session, queue, message)
        finally:
            session.consuming = False
            await _cancel_consumer(session)
            await self._close_session_if_idle(session)

    def _delivery(
        self, session: _Session, queue: str, message: AbstractIncomingMessage
    ) -> Delivery:
        headers = fill_message_id(decode_headers(message.headers), message.message_id)
        if message.content_encoding and CONTENT_ENCODING_HEADER not in headers:
            # Body classification reads headers only; a compressed body must say so there.
            headers[CONTENT_ENCODING_HEADER] = message.content_encoding

        async def ack() -> None:
            await self._settle(session, message.ack)

        async def reject(requeue: bool) -> None:
            await self._settle(session, lambda: message.reject(requeue=requeue))

        return Delivery(
            headers=headers, body=message.body, queue=queue, on_ack=ack, on_reject=reject
        )

    async def _settle(self, session: _Session, action: Callable[[], Awaitable[None]]) -> None:
        """Run ``message.ack``/``reject``. It only writes a frame (no broker reply), so
        it fails only when the delivering channel is gone, and then the broker has
        already requeued the message."""
        try:
            await action()
        except (*_CONNECTION_ERRORS, aio_pika.exceptions.MessageProcessError) as exc:
            await self._settled(session)
            raise DeliveryLostError(f"cannot settle the delivery: {exc!r}") from exc
        await self._settled(session)

    async def _settled(self, session: _Session) -> None:
        session.outstanding -= 1
        await self._close_session_if_idle(session)

    async def _close_session_if_idle(self, session: _Session) -> None:
        if session.consuming or session.outstanding > 0:
            return
        self._sessions.discard(session)
        await _close_session(session)

    # -- queues and channels ---------------------------------------------------------

    async def _ensure_queue(self, queue: str) -> None:
        """Make sure ``queue`` exists: passive declare, else declare it durable."""
        if queue in self._known_queues:
            return
        async with self._declaring:
            if queue not in self._known_queues:
                await self._declare_queue(queue)

    async def _declare_queue(self, queue: str) -> None:
        try:
            if not await self._queue_exists(queue):
                try:
                    async with self._probe() as channel:
                        await channel.declare_queue(queue, durable=True)
                except aiormq.exceptions.ChannelPreconditionFailed:
                    pass  # declared meanwhile by someone else, with other arguments: fine
        except _CONNECTION_ERRORS as exc:
            raise TransportError(f"cannot declare queue {queue!r}: {exc!r}") from exc
        self._known_queues.add(queue)

    async def _queue_exists(self, queue: str) -> bool:
        try:
            async with self._probe() as channel:
                await channel.declare_queue(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
        return True

    @contextlib.asynccontextmanager
    async def _probe(self) -> AsyncIterator[AbstractChannel]:
        """A short-lived plain (non-robust) channel: a failed passive declare closes
        the channel, and a robust one would reopen itself and repeat the declare."""
        connection = self._require_connection()
        channel = await aio_pika.Channel(connection, publisher_confirms=False)
        try:
            yield channel
        finally:
            with contextlib.suppress(*_CONNECTION_ERRORS):
                if not channel.is_closed:
                    await channel.close()

    def _require_connection(self) -> AbstractRobustConnection:
        if self._closed:
            raise TransportClosedError(f"{self!r} is closed")
        if self._connection is None:
            raise TransportClosedError(f"{self!r} is not started; call start() first")
        return self._connection

    def _require_publish_channel(self) -> AbstractChannel:
        self._require_connection()
        assert self._publish_channel is not None
        return self._publish_channel


def _refused_open(exc: BaseException) -> bool:
    """True when the broker answered ``connection.open`` with ``connection.close``: the
    login worked but the virtual host is missing or the user may not use it (aiormq
    reports it as an unexpected frame and drops the reply text)."""
    return isinstance(exc, aiormq.exceptions.InvalidFrameError) and "Connection.Close" in str(exc)


def _vhost_refusal(url: str) -> str:
    parts = urlsplit(url)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return (
        f"RabbitMQ at {parts.hostname}:{parts.port or 5672} refused virtual host {vhost!r}: "
        f"it does not exist or user {parts.username!r} may not use it (rabbitmqctl "
        "add_vhost / set_permissions, or fix the broker URL)"
    )


async def _start_consumer(session: _Session, queue: str, prefetch: int) -> None:
    """QoS, passive declare, ``basic.consume`` on the session's channel.

    Raises ``TransportError`` when the broker or connection fails meanwhile.
    """
    try:
        await session.channel.set_qos(prefetch_count=prefetch)
        # Passive: restored passively after a reconnect too, never conflicting with the
        # arguments NServiceBus declared the queue with.
        session.queue = await session.channel.declare_queue(queue, passive=True)
        # A plain consumer callback rather than aio-pika's queue iterator, whose robust
        # variant waits for a reconnect after its channel is closed on purpose; ending
        # the iteration is ours to decide.
        session.consumer_tag = await session.queue.consume(session.on_message)
    except _CONNECTION_ERRORS as exc:
        raise TransportError(f"cannot start consuming {queue!r}: {exc!r}") from exc


async def _cancel_consumer(session: _Session) -> None:
    """Stop the broker pushing to this session, then requeue what it pushed but the
    iteration never yielded."""
    tag, session.consumer_tag = session.consumer_tag, None
    with contextlib.suppress(*_CONNECTION_ERRORS, aiormq.exceptions.AMQPError):
        if tag is not None and session.queue is not None and not session.channel.is_closed:
            # After CancelOk nothing more arrives, so the drain below is complete.
            await session.queue.cancel(tag)
    while not session.buffer.empty():
        message = session.buffer.get_nowait()
        if message is not None and _channel_alive(message):
            with contextlib.suppress(*_CONNECTION_ERRORS, aiormq.exceptions.AMQPError):
                await message.reject(requeue=True)


async def _close_session(session: _Session) -> None:
    """Close the session's channel: the broker requeues what is still unacknowledged."""
    with contextlib.suppress(*_CONNECTION_ERRORS, aiormq.exceptions.AMQPError):
        if not session.channel.is_closed:
            await session.channel.close()


def _channel_alive(message: AbstractIncomingMessage) -> bool:
    """False when the channel that delivered ``message`` is closed (it can no longer
    be settled; the broker has requeued it)."""
    try:
        return not message.channel.is_closed
    except aiormq.exceptions.ChannelInvalidStateError:
        return False


def decode_headers(raw: Mapping[str, Any] | None) -> Headers:
    """AMQP header table -> ``{name: str | None}``.

    bytes (AMQP byte arrays, and long strings that are not UTF-8) decode as UTF-8,
    invalid bytes as ``\\xNN`` escapes so nothing is dropped; ``None`` (AMQP void)
    stays ``None``; booleans, numbers and timestamps become ``str(value)`` (timestamps
    as ISO 8601); nested tables and arrays become compact JSON of their decoded values.
    """
    return {str(name): _header_text(value) for name, value in (raw or {}).items()}


def _header_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, bool | int | float | decimal.Decimal):
        return str(value)
    return json.dumps(_jsonable(value), separators=(",", ":"), ensure_ascii=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool | int | float) or value is None:
        return value
    return _header_text(value)


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for logs and error messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))
