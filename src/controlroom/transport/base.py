"""The transport contract shared by the embedded queue and RabbitMQ.

A transport moves messages (string headers plus an opaque body) in and out of named,
durable queues. Consumers receive ``Delivery`` objects and settle each one exactly once:
``ack()`` (or ``ack_many()`` for a batch) after the database commit that made the message
safe (docs/design.md "Broker messages are acknowledged only after the commit"), or
``reject(requeue)``. Delivery is at least once: a delivery that is never settled comes
back, to this or another consumer.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from controlroom.exceptions import ControlroomError
from controlroom.settings_sources import MAX_PREFETCH, MAX_QUEUE_NAME_BYTES
from controlroom.transport.properties import MessageProperties, to_json_value

# The NServiceBus header that carries the message id. NServiceBus's RabbitMQ transport
# puts the id both here and in the AMQP ``message_id`` property; the header wins.
MESSAGE_ID_HEADER = "NServiceBus.MessageId"

# A transport that sees a compressed body (the AMQP ``content_encoding`` property) hands
# it to consumers under this header.
CONTENT_ENCODING_HEADER = "Content-Encoding"


class TransportError(ControlroomError):
    """The transport could not do what was asked (broker or queue file unreachable,
    broker refused a publish). Transient: retry later. A failed ``publish`` is
    ambiguous: the message may or may not have been enqueued."""


class TransportClosedError(TransportError):
    """The transport is not started, or was closed."""


class DeliveryLostError(TransportError):
    """A delivery can no longer be settled: its lease expired, the transport closed or
    the broker channel was lost. The message was (or will be) delivered again, so the
    caller must not treat it as acknowledged; the idempotent writer makes the replay
    harmless."""


Headers = dict[str, str | None]

UNREADABLE_HEADER = "Controlroom.Transport.Unreadable"
"""Set by a transport on a delivery it could not read whole: why (its headers or
properties unreadable, its body missing). What it could read is delivered beside it, and
the intake keeps the message as a failed import with that reason."""

AckMany = Callable[[Sequence["Delivery"]], Awaitable[None]]
"""A transport's hook that acknowledges several of its deliveries in one operation."""


async def _already_settled(*_requeue: bool) -> None:
    raise RuntimeError("the delivery was already settled")


@dataclass(eq=False)
class Delivery:
    """One message handed to a consumer, to be settled exactly once.

    ``headers`` maps header name to value; a value may be ``None`` (NServiceBus sends
    some headers empty-but-present). ``body`` is the exact payload bytes. ``queue`` is
    the queue the message came from. ``on_ack``, ``on_reject`` and ``on_ack_many`` are
    bound by the transport; callers use ``ack()``, ``reject()`` and this module's
    ``ack_many()``. ``on_ack_many`` (optional) acknowledges the deliveries that share it
    in one operation (one transaction, one AMQP frame). ``size`` is what the message
    holds in memory, in bytes: the body plus the UTF-8 text of the header names and
    values. ``properties``: the further broker properties it was published with
    (``publish(properties=)``; on RabbitMQ those of any producer), ``None`` when it had
    none; ``headers`` is their header table's string view
    (``properties.header_strings``). ``structured``: the headers whose values the queue
    carried as a table or an array (``properties.structured_kinds``), whose text in
    ``headers`` is their JSON.
    """

    headers: Headers
    body: bytes
    queue: str
    on_ack: Callable[[], Awaitable[None]] = field(repr=False)
    on_reject: Callable[[bool], Awaitable[None]] = field(repr=False)
    on_ack_many: AckMany | None = field(default=None, repr=False)
    properties: MessageProperties | None = field(default=None, repr=False)
    structured: Mapping[str, str] = field(default_factory=dict, repr=False)
    size: int = field(init=False)
    _settled: bool = field(default=False, init=False, repr=False)
    _acknowledged: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.size = message_size(self.headers, self.body)

    @property
    def settled(self) -> bool:
        """True once ``ack`` or ``reject`` succeeded or raised ``DeliveryLostError``."""
        return self._settled

    @property
    def acknowledged(self) -> bool:
        """True once ``ack`` (or ``ack_many``) succeeded: the message left the queue."""
        return self._acknowledged

    async def ack(self) -> None:
        """Remove the message from the queue for good. Call only after the commit.

        Raises ``DeliveryLostError`` when the message can no longer be acknowledged
        (it will be redelivered), ``RuntimeError`` when already settled. Any other
        error leaves the delivery unsettled and the call may be retried.
        """
        await self._settle(self.on_ack)
        self._acknowledged = True

    async def reject(self, requeue: bool) -> None:
        """Give the message back (``requeue=True``, redelivered in its original FIFO
        position where the transport can) or drop it (``requeue=False``; RabbitMQ
        dead-letters it when the queue has a dead-letter exchange).

        Raises as ``ack`` does.
        """
        await self._settle(lambda: self.on_reject(requeue))

    async def _settle(self, action: Callable[[], Awaitable[None]]) -> None:
        if self._settled:
            raise RuntimeError(f"delivery from queue {self.queue!r} was already settled")
        try:
            await action()
        except DeliveryLostError:
            self._mark_settled()  # nothing left to settle: the transport let it go
            raise
        self._mark_settled()

    def _mark_settled(self) -> None:
        """Settled for good. The transport's callbacks are dropped: they refer back to this
        delivery, and that reference cycle would keep its body in memory after the batch
        is done, until the cyclic garbage collector happened to run (docs/decisions.md
        "What ingestion holds is bounded by bytes")."""
        self._settled = True
        self.on_ack = _already_settled
        self.on_reject = _already_settled
        self.on_ack_many = None


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """What waits in a queue: ``messages`` ready to be delivered (not in flight) and, when
    the transport can tell, ``oldest_age_seconds``, the age of the oldest of them (0 when
    none waits; ``None``: unknown, as on RabbitMQ, which does not tell it over AMQP)."""

    messages: int
    oldest_age_seconds: float | None


def describe_depth(depth: QueueDepth | None, queue: str) -> str:
    """``depth`` of ``queue`` for the log: ``"12 waiting in error (oldest 30 s)"``, or that
    it is unknown (``None``: the transport could not answer)."""
    if depth is None:
        return f"depth of {queue} unknown"
    if depth.oldest_age_seconds is None or not depth.messages:
        return f"{depth.messages} waiting in {queue}"
    return f"{depth.messages} waiting in {queue} (oldest {depth.oldest_age_seconds:.0f} s)"


@runtime_checkable
class Transport(Protocol):
    """What the ingestion pipeline and the retry sender need from a queue system."""

    @property
    def destination(self) -> str:
        """Where the messages go and come from, one text for one queue system however its
        address is spelt, and without credentials: serves of one store must consume one
        (``runtime.serve_lock``)."""
        ...

    async def start(self) -> None:
        """Connect / open the queue store. Raises ``TransportError`` when unreachable."""
        ...

    async def close(self) -> None:
        """Stop every consumer and disconnect. Unsettled deliveries go back to their
        queue. Idempotent."""
        ...

    def consume(
        self, queue: str, prefetch: int, *, max_bytes: int | None = None
    ) -> AsyncGenerator[Delivery, None]:
        """Yield deliveries from ``queue`` (declared durable when missing) in FIFO
        order until the transport closes or the iterator is closed/cancelled.

        At most ``prefetch`` (>= 1) deliveries are unsettled at any time and, with
        ``max_bytes``, the messages this consumer holds (yielded and unsettled, or received
        and not yet yielded) add up to at most ``max_bytes`` bytes (``Delivery.size``),
        except that a message larger than that is taken when it would be held alone. A
        delivery counts as held until it is settled. Deliveries
        already yielded stay settleable after the iterator ends, until ``close()``.
        Close the iterator explicitly (``contextlib.aclosing``); a cancelled
        ``__anext__`` ends the iteration.
        """
        ...

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
        """Enqueue one message; returns only once it is durably accepted.

        ``message_id`` and ``content_type`` are message properties (AMQP properties on
        RabbitMQ); ``properties`` the further ones a Python task's worker reads
        (docs/design.md "Python task queues"), its typed ``headers`` merged over
        ``headers`` (a name in both takes the typed value); a consumer gets them back
        as ``Delivery.properties``. See ``resolve_message_id`` for the id a message gets when
        ``message_id`` is not given; a consumer sees it as the ``NServiceBus.MessageId``
        header when ``headers`` has none. Raises ``ValueError`` for a bad queue name or
        header, ``TransportError`` when the message may not have been accepted.
        """
        ...

    async def purge(self, queue: str) -> int:
        """Delete the ready (not in-flight) messages of ``queue``; returns how many."""
        ...

    async def queue_depth(self, queue: str) -> QueueDepth:
        """How many messages wait in ``queue`` (declared when missing). Raises
        ``TransportError`` when the broker or queue file cannot answer."""
        ...

    async def check(self) -> None:
        """Return when the connection is healthy; raise ``TransportError`` otherwise."""
        ...


def check_queue_name(queue: str) -> None:
    """Raise ``ValueError`` unless ``queue`` is a non-empty name of at most 255 UTF-8
    bytes."""
    if not isinstance(queue, str) or not queue:
        raise ValueError("queue name must be a non-empty string")
    if len(queue.encode("utf-8")) > MAX_QUEUE_NAME_BYTES:
        raise ValueError(f"queue name {queue[:40]!r}... is longer than 255 bytes of UTF-8")


def check_prefetch(prefetch: int) -> None:
    """Raise ``ValueError`` unless ``prefetch`` is an int from 1 to ``MAX_PREFETCH``."""
    if (
        isinstance(prefetch, bool)
        or not isinstance(prefetch, int)
        or not 1 <= prefetch <= MAX_PREFETCH
    ):
        raise ValueError(f"prefetch must be an integer from 1 to {MAX_PREFETCH}, got {prefetch!r}")


def check_max_bytes(max_bytes: int | None) -> None:
    """Raise ``ValueError`` unless ``max_bytes`` is ``None`` or a positive int."""
    if max_bytes is None:
        return
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive integer or None, got {max_bytes!r}")


def validate_headers(headers: Mapping[str, str | None]) -> Headers:
    """Copy ``headers`` after checking every name is a str and every value a str or
    ``None``, all encodable as UTF-8 (both transports store UTF-8).

    Raises ``ValueError`` naming the offending header.
    """
    result: Headers = {}
    for name, value in headers.items():
        if not isinstance(name, str):
            raise ValueError(f"header name {name!r} is not a string")
        if value is not None and not isinstance(value, str):
            raise ValueError(f"header {name!r} has a {type(value).__name__} value, not str")
        try:
            name.encode("utf-8")
            if value is not None:
                value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"header {name!r} is not valid Unicode text: {exc}") from exc
        result[name] = value
    return result


def validate_typed_headers(headers: Mapping[str, object]) -> dict[str, object]:
    """Copy a typed header table after checking every name is a str encodable as UTF-8
    and every value one ``properties.to_json_value`` can hold (what both transports
    carry). Raises ``ValueError`` naming the offending header."""
    result: dict[str, object] = {}
    for name, value in headers.items():
        if not isinstance(name, str):
            raise ValueError(f"header name {name!r} is not a string")
        try:
            name.encode("utf-8")
            to_json_value(value)
        except (UnicodeEncodeError, ValueError) as exc:
            raise ValueError(f"header {name!r} cannot be carried: {exc}") from exc
        result[name] = value
    return result


def resolve_message_id(headers: Mapping[str, str | None], message_id: str | None) -> str:
    """The message-id property to publish with: ``message_id``, else the
    ``NServiceBus.MessageId`` header (NServiceBus keeps property and header equal), else
    a new random id (32 hex digits).

    Why always an id: aiormq gives every message published without one a random id
    (it correlates returned messages by id), so on RabbitMQ a consumer would see an
    invented id anyway; the embedded queue does the same so both transports agree. The
    id is fixed at publish time, so redeliveries carry the same one.
    """
    if message_id:
        return message_id
    return headers.get(MESSAGE_ID_HEADER) or uuid.uuid4().hex


def fill_message_id(headers: Headers, message_id: str | None) -> Headers:
    """Set the ``NServiceBus.MessageId`` header from the message-id property when the
    header is absent. The header, when present (even ``None``), stays authoritative.

    Mutates and returns ``headers``.
    """
    if message_id is not None and MESSAGE_ID_HEADER not in headers:
        headers[MESSAGE_ID_HEADER] = message_id
    return headers


def message_size(headers: Mapping[str, str | None], body: bytes) -> int:
    """Bytes a message holds: ``body`` plus the UTF-8 length of every header name and
    value (what ``Delivery.size`` and the in-flight byte bound count)."""
    # surrogatepass: a header a transport decoded from non-UTF-8 bytes still has a size.
    return len(body) + sum(
        len(name.encode("utf-8", "surrogatepass"))
        + len((value or "").encode("utf-8", "surrogatepass"))
        for name, value in headers.items()
    )


async def ack_many(deliveries: Sequence[Delivery]) -> None:
    """Acknowledge ``deliveries`` in as few operations as their transports allow: those
    sharing an ``on_ack_many`` hook (one consumer's) together, others one by one. Call
    only after the commit that made every one of them safe.

    Raises ``RuntimeError`` (before settling anything) when one is already settled;
    ``DeliveryLostError`` after trying them all when some could not be acknowledged
    (every one is settled then: the lost ones will be delivered again). Any other error
    leaves the deliveries of the failing operation unsettled; the call may be retried
    with the unsettled ones.

    On RabbitMQ an acknowledgement may go out later than the call returns: a delivery
    behind one of the same channel that is still unsettled is acknowledged by the frame
    that settles that one (``_amqp_consumer.AckLedger``); the broker counts it
    unacknowledged meanwhile, and redelivers it if the connection is lost first (harmless
    after the commit).
    """
    for delivery in deliveries:
        if delivery.settled:
            raise RuntimeError(f"delivery from queue {delivery.queue!r} was already settled")
    groups: dict[AckMany | None, list[Delivery]] = {}
    for delivery in deliveries:
        groups.setdefault(delivery.on_ack_many, []).append(delivery)
    lost: DeliveryLostError | None = None
    for hook, members in groups.items():
        if hook is None:
            for delivery in members:
                try:
                    await delivery.ack()
                except DeliveryLostError as exc:
                    lost = exc
            continue
        try:
            await hook(members)
        except DeliveryLostError as exc:
            lost = exc
        for delivery in members:
            delivery._mark_settled()
            delivery._acknowledged = lost is None
    if lost is not None:
        raise lost
