"""docs/decisions.md "Metrics are labelled by route template": a transport tells how many messages
wait in a queue (ready, not in flight) and, where it can, the age of the oldest; per transport."""

from __future__ import annotations

import asyncio

import pytest

from controlroom.transport import EmbeddedQueue
from tests.transport.helpers import Collector, TransportFactory

pytestmark = pytest.mark.anyio

TIMEOUT = 30


async def test_depth_counts_the_ready_messages(
    transport_factory: TransportFactory, queue_name: str
) -> None:
    async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
        assert (await transport.queue_depth(queue_name)).messages == 0  # declared if missing
        for n in range(3):
            await transport.publish(queue_name, {"n": str(n)}, b"waiting")
        depth = await transport.queue_depth(queue_name)
        assert depth.messages == 3
        if isinstance(transport, EmbeddedQueue):
            assert depth.oldest_age_seconds is not None and depth.oldest_age_seconds >= 0
        else:  # RabbitMQ does not tell the age of a message over AMQP
            assert depth.oldest_age_seconds is None
        async with Collector(transport, queue_name, prefetch=1) as consumer:
            held = await consumer.get()
            await consumer.stop()
            assert (await transport.queue_depth(queue_name)).messages == 2  # one in flight
            await held.ack()
