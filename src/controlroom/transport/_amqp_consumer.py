"""One RabbitMQ ``consume()`` session: its channel and consumer, what it holds, and how it
settles (used by ``rabbitmq.RabbitMQTransport``).

Acknowledgements (docs/decisions.md "A batch is acknowledged at once"): a ``basic.ack`` with
``multiple`` settles every unsettled delivery tag of the channel up to its own, so one frame can
acknowledge a whole batch, but only when every tag below it is settled too. ``AckLedger`` keeps, per
AMQP channel, the tags delivered and not yet settled at the broker; an acknowledged tag above an
unsettled one waits until the tags below it are settled (the frame that settles them covers it) or
the channel closes (then it is acknowledged alone first). Nothing the consumer has not acknowledged
is ever covered.

In-flight bytes (docs/decisions.md "What ingestion holds is bounded by bytes"): RabbitMQ's prefetch
counts messages, not bytes. With ``max_bytes`` the session keeps a message the broker pushes only
while what it holds (buffered, or yielded and unsettled) stays within the bound, or when it holds
nothing; a message that does not fit is given back (``basic.reject`` with requeue: it keeps its
place in the queue) after the consumer is cancelled, so the broker sends nothing more, and consuming
resumes once a settlement makes room.

What the broker may push is bounded by bytes too: RabbitMQ ignores ``basic.qos``'s
``prefetch_size``, so with ``max_bytes`` the prefetch count each ``basic.consume`` gets is
the room left divided by the mean size of the recent messages (at least 1, at most the
configured prefetch; 1 before any message is seen). RabbitMQ applies a new per-consumer
prefetch only to consumers started after it, so when the room grows to twice the count
the consumer was started with, the session re-consumes (cancel, give back what arrives
meanwhile, consume again); when messages grow, the first that does not fit pauses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from controlroom.transport.base import Delivery, DeliveryLostError, Headers, TransportError
from controlroom.transport.properties import MessageProperties, structured_kinds

log = logging.getLogger(__name__)

# Errors that mean "the connection or channel is gone or going": transient by nature.
CONNECTION_ERRORS = (
    aiormq.exceptions.AMQPConnectionError,
    aiormq.exceptions.ChannelClosed,
    aiormq.exceptions.ChannelInvalidStateError,
    ConnectionError,
)


class _BrokerCancelled:
    """What the buffer holds once the broker has cancelled the session's consumer."""


BROKER_CANCELLED = _BrokerCancelled()

RESUME_RETRY_SECONDS = 1.0
RECENT_SIZES = 16  # messages whose mean size estimates the next one's


@dataclass(eq=False)
class AckLedger:
    """Settlement of one AMQP channel's deliveries (tags count up from 1 per channel; a
    reconnect starts a new channel and a new ledger).

    Frames go out one at a time in the order the state changes (the lock): a single ack
    or reject overtaken by a later ``multiple`` would name a tag the broker no longer
    knows, which closes the channel.
    """

    channel: aiormq.abc.AbstractChannel
    unsettled: dict[int, None] = field(default_factory=dict)  # delivered, in tag order
    waiting: set[int] = field(default_factory=set)  # acknowledged, frame not sent yet
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def received(self, tag: int) -> None:
        self.unsettled[tag] = None

    async def ack(self, tags: Sequence[int]) -> None:
        """Acknowledge ``tags``: now, in one frame, as far as every tag below is settled;
        the rest with the frame that settles the tags below them."""
        async with self.lock:
            self.waiting.update(tags)
            await self._send_acks()

    async def reject(self, tag: int, *, requeue: bool) -> None:
        async with self.lock:
            self.unsettled.pop(tag, None)
            await self.channel.basic_reject(tag, requeue=requeue)
            await self._send_acks()  # the reject may have closed a gap

    async def ack_waiting_one_by_one(self) -> None:
        """Before the channel closes: acknowledge alone what still waits behind a tag
        that stays unsettled (it goes back to the queue with the channel)."""
        async with self.lock:
            for tag in sorted(self.waiting):
                self.unsettled.pop(tag, None)
                await self.channel.basic_ack(tag)
            self.waiting.clear()

    async def _send_acks(self) -> None:
        covered: list[int] = []
        for tag in self.unsettled:  # ascending: tags are inserted in delivery order
            if tag not in self.waiting:
                break
            covered.append(tag)
        if not covered:
            return
        for tag in covered:
            del self.unsettled[tag]
            self.waiting.discard(tag)
        await self.channel.basic_ack(covered[-1], multiple=len(covered) > 1)


@dataclass(eq=False, slots=True)
class _Held:
    ledger: AckLedger
    tag: int


MakeHeaders = Callable[[AbstractIncomingMessage], Headers]


class ConsumerSession:
    """The broker's pushes to one ``consume()`` call, as ``Delivery`` objects.

    ``next_delivery()`` yields them in order; the channel stays open until every yielded
    delivery is settled (``on_idle`` is then awaited) or ``close()``.
    """

    def __init__(
        self,
        channel: AbstractChannel,
        queue: str,
        *,
        prefetch: int,
        max_bytes: int | None,
        make_headers: MakeHeaders,
        on_idle: Callable[[ConsumerSession], Awaitable[None]],
    ) -> None:
        self.channel = channel
        self._queue_name = queue
        self._prefetch = prefetch
        self._max_bytes = max_bytes
        self._make_headers = make_headers
        self._on_idle = on_idle
        self._queue: AbstractQueue | None = None
        self._consumer_tag: str | None = None
        self._ledger: AckLedger | None = None
        # None is the stop signal put by close(); BROKER_CANCELLED the broker's cancel.
        self._buffer: asyncio.Queue[Delivery | _BrokerCancelled | None] = asyncio.Queue()
        self._held: dict[Delivery, _Held] = {}
        self.held_bytes = 0  # Delivery.size of what is buffered or yielded and unsettled
        self._outstanding = 0  # yielded, not settled
        self.consuming = True
        self._paused = False
        self._given_back = 0  # size of the last message that did not fit
        self._flow = asyncio.Lock()  # one cancel or consume at a time
        self._resuming: asyncio.Task[None] | None = None
        self._recent_sizes: deque[int] = deque(maxlen=RECENT_SIZES)
        self._consumer_prefetch = prefetch  # basic.qos of the running consumer

    @property
    def idle(self) -> bool:
        return not self.consuming and self._outstanding == 0

    # -- consuming ---------------------------------------------------------------------

    async def start(self) -> None:
        """QoS, passive declare, ``basic.consume``. Raises ``TransportError`` when the
        broker or connection fails meanwhile."""
        try:
            await self._apply_prefetch()
            # Passive: restored passively after a reconnect too, never conflicting with
            # the arguments NServiceBus declared the queue with.
            self._queue = await self.channel.declare_queue(self._queue_name, passive=True)
            # A plain consumer callback rather than aio-pika's queue iterator, whose
            # robust variant waits for a reconnect after its channel is closed on
            # purpose; ending the iteration is ours to decide.
            self._consumer_tag = await self._queue.consume(self._on_message)
            underlay = await self.channel.get_underlay_channel()
        except CONNECTION_ERRORS as exc:
            raise TransportError(f"cannot start consuming {self._queue_name!r}: {exc!r}") from exc
        underlay.on_consumer_cancel_callbacks.add(self._on_broker_cancel)

    async def next_delivery(self) -> Delivery | None:
        """The next delivery to yield, or ``None`` once the transport closes. Raises
        ``TransportError`` once the broker has cancelled the consumer."""
        while (delivery := await self._buffer.get()) is not None:
            if isinstance(delivery, _BrokerCancelled):
                self.consuming = False
                raise TransportError(
                    f"the broker cancelled the consumer of {self._queue_name!r} (the queue "
                    "was deleted, or its node went down): consuming again declares it"
                )
            if self._held[delivery].ledger.channel.is_closed:
                self._forget(delivery)  # from before a reconnect: the broker redelivers it
                continue
            self._outstanding += 1
            return delivery
        return None

    def wake_for_close(self) -> None:
        self._buffer.put_nowait(None)

    async def stop(self) -> None:
        """Stop the broker pushing to this session, then give back what it pushed but
        the iteration never yielded."""
        self.consuming = False
        if self._resuming is not None:
            self._resuming.cancel()
        async with self._flow:
            await self._cancel_consumer()
        while not self._buffer.empty():
            delivery = self._buffer.get_nowait()
            if not isinstance(delivery, Delivery):
                continue
            held = self._forget(delivery)
            with contextlib.suppress(*CONNECTION_ERRORS, aiormq.exceptions.AMQPError):
                await held.ledger.reject(held.tag, requeue=True)

    async def close(self) -> None:
        """Close the channel: the broker requeues what is still unacknowledged."""
        with contextlib.suppress(*CONNECTION_ERRORS, aiormq.exceptions.AMQPError):
            if self._ledger is not None and not self._ledger.channel.is_closed:
                await self._ledger.ack_waiting_one_by_one()
            if not self.channel.is_closed:
                await self.channel.close()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        try:
            channel = message.channel
        except aiormq.exceptions.ChannelInvalidStateError:
            return  # closed already: the broker requeues it
        if self._ledger is None or self._ledger.channel is not channel:
            self._ledger = AckLedger(channel)
            # A reconnect restored the consumer on this channel: watch its cancels too.
            channel.on_consumer_cancel_callbacks.add(self._on_broker_cancel)
        ledger = self._ledger
        tag = message.delivery_tag
        assert tag is not None  # a pushed (not no-ack) message always has one
        ledger.received(tag)
        if not self.consuming:  # pushed before the cancel took effect: nobody will yield it
            with contextlib.suppress(*CONNECTION_ERRORS, aiormq.exceptions.AMQPError):
                await ledger.reject(tag, requeue=True)
            return
        alone = not self._held
        delivery = self._delivery(message, ledger, tag)
        self._recent_sizes.append(delivery.size)
        if not self._paused and (alone or self._fits(delivery.size)):
            self.held_bytes += delivery.size
            self._buffer.put_nowait(delivery)
            await self._retune_if_room_grew()
            return
        # Given back, and so is everything after it until consuming resumes (the queue's
        # order is kept: a requeued message keeps its place).
        del self._held[delivery]
        if not self._paused:
            self._paused = True
            self._given_back = delivery.size
        # Cancel first: once the broker confirms, nothing more is pushed, so what is given
        # back is not pushed straight back to this consumer.
        await self._stop_pushing()
        with contextlib.suppress(*CONNECTION_ERRORS, aiormq.exceptions.AMQPError):
            await ledger.reject(tag, requeue=True)

    def _on_broker_cancel(self, frame: aiormq.spec.Basic.Cancel) -> None:
        """RabbitMQ cancels a consumer whose queue was deleted (or whose node went down):
        nothing more will be pushed, so the iteration ends with an error rather than
        waiting for ever, and the intake that reads it ends and is started again."""
        if frame.consumer_tag == self._consumer_tag and self.consuming:
            self._buffer.put_nowait(BROKER_CANCELLED)

    def _fits(self, size: int) -> bool:
        return self._max_bytes is None or self.held_bytes + size <= self._max_bytes

    def _prefetch_for_room(self) -> int:
        """The prefetch count a consumer started now gets: the messages of the recent
        mean size that fit in the room left, at least 1, at most the configured prefetch
        (1 before any message is seen)."""
        if self._max_bytes is None:
            return self._prefetch
        if not self._recent_sizes:
            return 1
        mean = sum(self._recent_sizes) / len(self._recent_sizes)
        room = self._max_bytes - self.held_bytes
        return max(1, min(self._prefetch, int(room // max(mean, 1))))

    async def _apply_prefetch(self) -> None:
        """``basic.qos`` for the next ``basic.consume`` (per consumer, RabbitMQ's
        default: it applies to consumers started after it)."""
        self._consumer_prefetch = self._prefetch_for_room()
        await self.channel.set_qos(prefetch_count=self._consumer_prefetch)

    def _delivery(self, message: AbstractIncomingMessage, ledger: AckLedger, tag: int) -> Delivery:
        async def ack() -> None:
            await self._settle([delivery], ledger.ack([tag]))

        async def reject(requeue: bool) -> None:
            await self._settle([delivery], ledger.reject(tag, requeue=requeue))

        delivery = Delivery(
            headers=self._make_headers(message),
            body=message.body,
            queue=self._queue_name,
            on_ack=ack,
            on_reject=reject,
            on_ack_many=self._ack_many,
            properties=MessageProperties(
                content_encoding=message.content_encoding,
                correlation_id=message.correlation_id,
                reply_to=message.reply_to,
                priority=message.priority,
                headers=message.headers or None,
            ),
            structured=structured_kinds(message.headers),
        )
        self._held[delivery] = _Held(ledger, tag)
        return delivery

    # -- settling ----------------------------------------------------------------------

    async def _ack_many(self, deliveries: Sequence[Delivery]) -> None:
        """Acknowledge ``deliveries`` (this session's) with one frame per channel."""
        by_ledger: dict[AckLedger, list[int]] = {}
        for delivery in deliveries:
            held = self._held[delivery]
            by_ledger.setdefault(held.ledger, []).append(held.tag)
        lost: DeliveryLostError | None = None
        for ledger, tags in by_ledger.items():
            try:
                await self._settle([], ledger.ack(tags))
            except DeliveryLostError as exc:
                lost = exc
        await self._settled(deliveries)
        if lost is not None:
            raise lost

    async def _settle(self, deliveries: Sequence[Delivery], action: Awaitable[None]) -> None:
        """Await ``action`` (an ack or reject frame: no broker reply, so it fails only
        when the channel is gone, and then the broker has requeued the message)."""
        try:
            await action
        except (*CONNECTION_ERRORS, aio_pika.exceptions.MessageProcessError) as exc:
            await self._settled(deliveries)
            raise DeliveryLostError(f"cannot settle the delivery: {exc!r}") from exc
        await self._settled(deliveries)

    async def _settled(self, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        for delivery in deliveries:
            self._forget(delivery)
            self._outstanding -= 1
        self._schedule_resume()
        await self._retune_if_room_grew()
        if self.idle:
            await self._on_idle(self)

    def _forget(self, delivery: Delivery) -> _Held:
        self.held_bytes -= delivery.size
        return self._held.pop(delivery)

    # -- flow --------------------------------------------------------------------------

    async def _retune_if_room_grew(self) -> None:
        """Re-consume when twice the running consumer's prefetch now fits: it was
        started with less room or before the sizes were known (at most log2(prefetch)
        times in a row; shrinking needs no re-consume: what does not fit pauses)."""
        if self._paused or not self.consuming:
            return
        if self._prefetch_for_room() < 2 * self._consumer_prefetch:
            return
        self._paused = True
        self._given_back = 0
        await self._stop_pushing()

    async def _stop_pushing(self) -> None:
        async with self._flow:
            if self._paused:
                await self._cancel_consumer()
        self._schedule_resume()  # settlements during the cancel may have made room

    def _has_room(self) -> bool:
        """Room for the message given back last (the broker pushes it again first)."""
        return not self._held or self._fits(self._given_back)

    def _schedule_resume(self) -> None:
        if self._paused and self.consuming and self._resuming is None and self._has_room():
            self._resuming = asyncio.create_task(self._resume())

    async def _resume(self) -> None:
        """Consume again (retrying while the channel is being restored, and after an
        error it does not expect, logged: nobody awaits this task, and a pause that never
        ends would leave the queue unread while the intake waits)."""
        try:
            while self.consuming and self._paused:
                if not self._has_room():
                    return  # the next settlement tries again
                async with self._flow:
                    if not (self.consuming and self._paused) or self._queue is None:
                        return
                    try:
                        await self._apply_prefetch()
                        # Before the RPC: the broker pushes right after ConsumeOk.
                        self._paused = False
                        self._consumer_tag = await self._queue.consume(self._on_message)
                    except (*CONNECTION_ERRORS, RuntimeError):
                        self._paused = True
                        log.warning("cannot resume consuming yet; retrying", exc_info=True)
                    except Exception:
                        self._paused = True
                        log.exception(
                            "consuming %s could not resume; retrying in %.1f s",
                            self._queue.name,
                            RESUME_RETRY_SECONDS,
                        )
                    else:
                        return
                await asyncio.sleep(RESUME_RETRY_SECONDS)
        finally:
            self._resuming = None

    async def _cancel_consumer(self) -> None:
        tag, self._consumer_tag = self._consumer_tag, None
        with contextlib.suppress(*CONNECTION_ERRORS, aiormq.exceptions.AMQPError):
            if tag is not None and self._queue is not None and not self.channel.is_closed:
                # After CancelOk nothing more arrives for this consumer.
                await self._queue.cancel(tag)
