"""docs/decisions.md "A batch is acknowledged at once": a committed batch is acknowledged at once
(RabbitMQ: one ``basic.ack`` with ``multiple`` over contiguous delivery tags; the embedded queue:
one transaction), and an acknowledgement never covers a delivery the batch does not hold.

Frames and transactions are counted by wrapping the client's own calls (aiormq's
``basic_ack``, the embedded queue's write transaction); the broker and the queue file are
real. Whether a message was acknowledged is read back from the broker (it comes back or
not after the consumer's connection closes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import aiormq
import pytest

from controlroom.transport import Delivery, EmbeddedQueue, RabbitMQTransport, Transport
from controlroom.transport import embedded as embedded_module
from controlroom.transport.base import ack_many
from controlroom.transport.batching import ack_all
from tests.transport.helpers import Collector, TransportFactory

pytestmark = pytest.mark.anyio

TIMEOUT = 60  # seconds, per test


async def publish_numbered(transport: Transport, queue: str, count: int) -> None:
    for n in range(count):
        await transport.publish(queue, {"n": str(n)}, f"message {n}".encode())


def numbers(deliveries: list[Delivery]) -> list[int]:
    return sorted(int(d.headers["n"] or "") for d in deliveries)


async def drain(transport: Transport, queue: str, *, idle: float = 1.0) -> list[int]:
    """Take (and acknowledge) whatever ``queue`` still holds; returns the numbers."""
    taken: list[Delivery] = []
    async with Collector(transport, queue, prefetch=50) as consumer:
        while True:
            try:
                delivery = await consumer.get(timeout=idle)
            except TimeoutError:
                break
            taken.append(delivery)
            await delivery.ack()
    return numbers(taken)


@contextlib.contextmanager
def counting_basic_acks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, bool]]]:
    """Record every ``basic.ack`` frame the client sends: (delivery tag, multiple)."""
    sent: list[tuple[int, bool]] = []
    real = aiormq.Channel.basic_ack

    async def basic_ack(self: Any, delivery_tag: int, multiple: bool = False, **kw: Any) -> None:
        sent.append((delivery_tag, multiple))
        await real(self, delivery_tag, multiple, **kw)

    monkeypatch.setattr(aiormq.Channel, "basic_ack", basic_ack)
    yield sent


# -- every transport ------------------------------------------------------------------


async def test_ack_many_removes_exactly_the_batch(
    transport_factory: TransportFactory, queue_name: str
) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with transport_factory() as transport:
            await publish_numbered(transport, queue_name, 10)
            async with Collector(transport, queue_name, prefetch=10) as consumer:
                held = await consumer.get_many(10)
                batch = [d for d in held if int(d.headers["n"] or "") not in (3, 4)]
                await ack_many(batch)
                assert all(d.settled for d in batch)
                assert not any(d.settled for d in held if d not in batch)
                with pytest.raises(RuntimeError):
                    await ack_many(batch[:1])  # already settled
        # 3 and 4 were never settled: closing gave them back, and only them.
        async with transport_factory() as transport:
            assert await drain(transport, queue_name) == [3, 4]


async def test_a_delivery_given_back_mid_batch_is_not_acknowledged_with_it(
    transport_factory: TransportFactory, queue_name: str
) -> None:
    async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
        await publish_numbered(transport, queue_name, 8)
        async with Collector(transport, queue_name, prefetch=8) as consumer:
            held = await consumer.get_many(8)
            gap = next(d for d in held if d.headers["n"] == "4")
            await gap.reject(requeue=True)
            await ack_all([d for d in held if d is not gap])
            again = await consumer.get()  # the gap comes back: it was not acknowledged
            assert again.headers["n"] == "4"
            await again.ack()
            await consumer.assert_idle(0.5)
        assert await drain(transport, queue_name) == []


# -- RabbitMQ: one frame, never over a gap --------------------------------------------


@pytest.mark.rabbitmq
async def test_rabbitmq_acknowledges_a_batch_in_one_frame(
    rabbitmq_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with asyncio.timeout(TIMEOUT), RabbitMQTransport(rabbitmq_url) as transport:
        await publish_numbered(transport, queue_name, 20)
        async with Collector(transport, queue_name, prefetch=20) as consumer:
            held = await consumer.get_many(20)
            with counting_basic_acks(monkeypatch) as sent:
                await ack_all(held)
            assert len(sent) == 1 and sent[0][1] is True, sent
            await consumer.assert_idle(0.5)
        assert await drain(transport, queue_name) == []


@pytest.mark.rabbitmq
async def test_rabbitmq_never_acknowledges_over_a_delivery_another_batch_holds(
    rabbitmq_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two batches committed out of order: the later one's acknowledgement may not cover
    the earlier one's tags while that batch is unsettled; once it is, one frame does both."""
    async with asyncio.timeout(TIMEOUT):
        async with RabbitMQTransport(rabbitmq_url) as transport:
            await publish_numbered(transport, queue_name, 12)
            async with Collector(transport, queue_name, prefetch=12) as consumer:
                held = await consumer.get_many(12)
                first, second = held[:6], held[6:]
                with counting_basic_acks(monkeypatch) as sent:
                    await ack_all(second)
                    assert sent == []  # covering tags 1..12 would acknowledge `first`
                    await ack_all(first[:3])
                    assert sent == [(3, True)]
                    await ack_all(first[3:])
                    assert sent == [(3, True), (12, True)]
                await consumer.assert_idle(0.5)
        async with RabbitMQTransport(rabbitmq_url) as transport:
            assert await drain(transport, queue_name) == []


@pytest.mark.rabbitmq
async def test_rabbitmq_close_gives_back_the_unsettled_and_keeps_the_committed(
    rabbitmq_url: str, queue_name: str
) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with RabbitMQTransport(rabbitmq_url) as transport:
            await publish_numbered(transport, queue_name, 10)
            async with Collector(transport, queue_name, prefetch=10) as consumer:
                held = await consumer.get_many(10)
                await ack_all(held[5:])  # behind 0..4, which stay unsettled
        async with RabbitMQTransport(rabbitmq_url) as transport:
            assert await drain(transport, queue_name) == [0, 1, 2, 3, 4]


# -- embedded: one transaction --------------------------------------------------------


async def test_embedded_acknowledges_a_batch_in_one_transaction(
    queue_path: Any, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    transactions: list[int] = []
    real = embedded_module._write_transaction

    def counting(*args: Any, **kwargs: Any) -> Any:
        transactions.append(1)
        return real(*args, **kwargs)

    async with asyncio.timeout(TIMEOUT), EmbeddedQueue(queue_path) as transport:
        await publish_numbered(transport, queue_name, 20)
        async with Collector(transport, queue_name, prefetch=20) as consumer:
            held = await consumer.get_many(20)
            await consumer.stop()  # no claim transactions meanwhile
            monkeypatch.setattr(embedded_module, "_write_transaction", counting)
            await ack_all(held)
            monkeypatch.undo()
            assert len(transactions) == 1
        assert await drain(transport, queue_name) == []
