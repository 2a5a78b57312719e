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
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractRobustConnection,
)

from controlroom.runtime.addresses import url_host
from controlroom.transport import _amqp_names
from controlroom.transport._amqp_consumer import CONNECTION_ERRORS, ConsumerSession
from controlroom.transport.base import (
    CONTENT_ENCODING_HEADER,
    UNREADABLE_HEADER,
    Delivery,
    Headers,
    QueueDepth,
    TransportClosedError,
    TransportError,
    check_max_bytes,
    check_prefetch,
    check_queue_name,
    fill_message_id,
    resolve_message_id,
    validate_headers,
    validate_typed_headers,
)
from controlroom.transport.properties import MessageProperties, header_strings

log = logging.getLogger(__name__)

CONNECTION_NAME = "controlroom"


MAX_FIELD_NAME_BYTES = 128
"""Longest header name AMQP carries whole (pamqp truncates longer ones when encoding)."""

MAX_SHORT_STRING_BYTES = 255
"""Longest ``message_id`` and ``content_type`` property (AMQP short strings; pamqp raises
``TypeError`` when encoding a longer one)."""

CONTENT_HEADER_OVERHEAD = 7 + 12 + 1
"""Bytes of a content header frame besides the encoded properties: the frame header (type,
channel, size), class id, weight and body size, and the frame end octet (AMQP 0-9-1 4.2.3,
4.2.6)."""

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
        self._sessions: set[ConsumerSession] = set()
        self._known_queues: set[str] = set()  # declared on this connection
        # One queue declaration at a time: probe channels opened concurrently race for a
        # channel number and the broker closes the whole connection ("second
        # 'channel.open' seen"; docs/decisions.md "RabbitMQ queues are declared one at a time").
        self._declaring = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"RabbitMQTransport({redact_url(self._url)!r})"

    @property
    def destination(self) -> str:
        """The broker and virtual host, one text however the URL spells them: scheme and
        host lower-cased, the port given or the scheme's default, the vhost; no user,
        password or query (``Transport.destination``)."""
        parts = urlsplit(self._url)
        scheme = parts.scheme.lower()
        port = parts.port or (5671 if scheme == "amqps" else 5672)
        vhost = quote(unquote(parts.path[1:]) or "/", safe="")
        host = url_host((parts.hostname or "").lower())
        return f"RabbitMQ {scheme}://{host}:{port}/{vhost}"

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
            session.wake_for_close()  # ends the consume() loop
            await session.close()
        self._sessions.clear()
        if self._connection is not None:
            with contextlib.suppress(*CONNECTION_ERRORS):
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
        properties: MessageProperties | None = None,
    ) -> None:
        """Publish persistently to ``queue`` via the default exchange; returns after
        the broker's publisher confirm (the message is on disk or replicated).
        ``properties`` become the AMQP properties of those names and their typed
        ``headers`` go into the header table as they are (ints stay ints).

        The queue is declared durable first when it does not exist. A ``content_type``
        longer than an AMQP short string (255 bytes) is left out of the properties (the
        headers still carry it). Raises ``ValueError`` for bad input (among it a message
        id over 255 bytes, and properties and headers that do not fit in one frame of the
        connection's negotiated ``frame_max``: the broker would close the whole
        connection), ``TransportError`` when the broker nacks, cannot
        route, does not confirm within ``publish_timeout_seconds``, or the connection
        fails (the last two leave the outcome unknown: a retry may duplicate the
        message). During a connection outage it fails at once rather than waiting for
        the reconnect.
        """
        check_queue_name(queue)
        if not isinstance(body, bytes | bytearray | memoryview):
            raise ValueError(f"body must be bytes, not {type(body).__name__}")
        strings = validate_headers(headers)
        valid: dict[str, Any] = dict(strings)
        extra = properties or MessageProperties()
        if extra.headers is not None:
            valid.update(_amqp_table(validate_typed_headers(extra.headers)))
        for name in valid:
            size = len(name.encode("utf-8"))
            if size > MAX_FIELD_NAME_BYTES:
                raise ValueError(
                    f"header name {name[:60]!r}... is {size} bytes of UTF-8; AMQP field names "
                    f"hold at most {MAX_FIELD_NAME_BYTES} (it would be cut short)"
                )
        resolved_id = resolve_message_id(strings, message_id)
        if len(resolved_id.encode("utf-8", "surrogatepass")) > MAX_SHORT_STRING_BYTES:
            raise ValueError(
                f"message id {resolved_id[:60]!r}... is longer than the "
                f"{MAX_SHORT_STRING_BYTES} bytes of the AMQP message-id property"
            )
        if content_type is not None and not _fits_short_string(content_type):
            content_type = None  # the NServiceBus.ContentType header carries it whole
        message = aio_pika.Message(
            bytes(body),
            headers=valid,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=resolved_id,
            content_type=content_type,
            content_encoding=extra.content_encoding,
            correlation_id=extra.correlation_id,
            reply_to=extra.reply_to,
            priority=extra.priority,
        )
        channel = self._require_publish_channel()
        self._check_header_frame(message)
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
        except (*CONNECTION_ERRORS, RuntimeError) as exc:
            # RuntimeError: aio-pika's word for a channel or connection it has closed.
            raise TransportError(f"publish to {queue!r} failed, outcome unknown: {exc!r}") from exc

    def _check_header_frame(self, message: aio_pika.Message) -> None:
        """Raise ``ValueError`` when the content header frame of ``message`` (properties
        and header table) is larger than the negotiated ``frame_max``: content headers
        cannot be split across frames, and the broker answers one too large by closing
        the connection (``FRAME_ERROR``), dropping every consumer on it."""
        underlay = self._require_connection().transport
        if underlay is None:
            return  # reconnecting: the publish fails as a connection error
        frame_max = underlay.connection.connection_tune.frame_max
        size = CONTENT_HEADER_OVERHEAD + len(message.properties.marshal())
        if frame_max and size > frame_max:
            raise ValueError(
                f"the message headers and properties encode to a {size}-byte AMQP frame; "
                f"the connection's frame_max is {frame_max} bytes (shorten or drop large "
                "headers)"
            )

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
        except CONNECTION_ERRORS as exc:
            raise TransportError(f"cannot purge {queue!r}: {exc!r}") from exc
        return int(result.message_count or 0)

    async def queue_depth(self, queue: str) -> QueueDepth:
        """The ready messages of ``queue`` (a passive declare's ``message_count``; the
        unacknowledged ones are not counted); the age is unknown over AMQP. Declares the
        queue when missing."""
        check_queue_name(queue)
        await self._ensure_queue(queue)
        try:
            async with self._probe() as channel:
                amqp_queue = await channel.declare_queue(queue, passive=True)
        except CONNECTION_ERRORS as exc:
            raise TransportError(f"cannot read the depth of {queue!r}: {exc!r}") from exc
        declared = amqp_queue.declaration_result
        return QueueDepth(messages=int(declared.message_count or 0), oldest_age_seconds=None)

    # -- consumer side ---------------------------------------------------------------

    async def consume(
        self, queue: str, prefetch: int, *, max_bytes: int | None = None
    ) -> AsyncGenerator[Delivery, None]:
        """Yield deliveries of ``queue`` in broker order, at most ``prefetch``
        unacknowledged (``basic.qos``) and, with ``max_bytes``, at most that many bytes
        held (``_amqp_consumer``: a message that does not fit is given back and the
        consumer paused until there is room). See ``Transport.consume``.

        When the iterator ends, the consumer is cancelled and pushed-but-unyielded
        messages are requeued; the channel stays open until every yielded delivery is
        settled, or ``close()``.
        """
        check_queue_name(queue)
        check_prefetch(prefetch)
        check_max_bytes(max_bytes)
        connection = self._require_connection()
        await self._ensure_queue(queue)
        try:
            channel = await connection.channel(publisher_confirms=False)
        except (*CONNECTION_ERRORS, RuntimeError) as exc:  # RuntimeError: not connected
            raise TransportError(f"cannot open a channel to consume {queue!r}: {exc!r}") from exc
        session = ConsumerSession(
            channel,
            queue,
            prefetch=prefetch,
            max_bytes=max_bytes,
            make_headers=_message_headers,
            on_idle=self._close_idle_session,
        )
        self._sessions.add(session)
        try:
            await session.start()
            while (delivery := await session.next_delivery()) is not None:
                yield delivery
        except TransportError:
            self._known_queues.discard(queue)  # deleted, maybe: the next consume declares it
            raise
        finally:
            await session.stop()
            if session.idle:
                await self._close_idle_session(session)

    async def _close_idle_session(self, session: ConsumerSession) -> None:
        if session in self._sessions:
            self._sessions.discard(session)
            await session.close()

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
        except CONNECTION_ERRORS as exc:
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
            with contextlib.suppress(*CONNECTION_ERRORS):
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


def _message_headers(message: AbstractIncomingMessage) -> Headers:
    """The headers a consumer sees: the message-id property fills a missing
    ``NServiceBus.MessageId``; a compressed body says so in ``Content-Encoding`` (body
    classification reads headers only)."""
    headers = fill_message_id(decode_headers(message.headers), message.message_id)
    if message.content_encoding and CONTENT_ENCODING_HEADER not in headers:
        headers[CONTENT_ENCODING_HEADER] = message.content_encoding
    too_deep = _amqp_names.nested_too_deep(message.headers)
    if too_deep is not None:
        headers[UNREADABLE_HEADER] = too_deep
    return headers


def decode_headers(raw: Mapping[str, Any] | None) -> Headers:
    """AMQP header table -> ``{name: str | None}`` (``properties.header_strings``)."""
    return header_strings(raw)


def _amqp_table(value: Any) -> Any:
    """A typed header value as pamqp encodes it: bytes as an AMQP byte array (pamqp takes
    ``bytearray`` only)."""
    if isinstance(value, bytes | memoryview):
        return bytearray(value)
    if isinstance(value, Mapping):
        return {name: _amqp_table(item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_amqp_table(item) for item in value]
    return value


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for logs and error messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _fits_short_string(value: str) -> bool:
    return len(value.encode("utf-8", "surrogatepass")) <= MAX_SHORT_STRING_BYTES
