"""docs/decisions.md "Every delivery is settled exactly once": an intake told to stop
finishes the batches in hand and starts no other, even when the stop (a cancellation)
arrives in the same turn of the event loop as the delivery a partial batch waits for.

The deliveries are real (taken from the transport, held unsettled); what this test
controls is the order in which the batcher sees them and the stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from controlroom.config import IngestionSettings
from controlroom.transport import Delivery
from controlroom.transport.batching import DeliveryBatcher
from tests.transport.helpers import Collector, TransportFactory

pytestmark = pytest.mark.anyio

TIMEOUT = 60  # seconds, per test


class _Scripted:
    """A transport whose ``consume`` hands out ``deliveries`` in an order the test sets:
    the first two (one full batch), then, once that batch is in the handler's hands and
    the batcher waits for a partial batch to fill, the last one together with ``stop``."""

    def __init__(self, deliveries: list[Delivery], first_batch_held: asyncio.Event) -> None:
        self._deliveries = deliveries
        self._first_batch_held = first_batch_held
        self.stop: asyncio.Task[None] | None = None
        self.stopping = False

    async def consume(
        self, queue: str, prefetch: int, *, max_bytes: int | None = None
    ) -> AsyncIterator[Delivery]:
        first, second, third, fourth = self._deliveries
        yield first
        yield second
        await self._first_batch_held.wait()
        yield third
        # Only ready callbacks run between these turns (no timer, no I/O): the batcher
        # takes the third and waits, lingering, for a fourth.
        for _ in range(50):
            await asyncio.sleep(0)
        yield fourth
        # The fourth is in the inbox, the batcher's wait for it is woken: stop now, in
        # the same turn, as an intake's ``stop()`` does (the flag, then the cancellation).
        assert self.stop is not None
        self.stopping = True
        self.stop.cancel()
        await asyncio.Event().wait()


async def test_a_stop_that_meets_a_delivery_starts_no_batch_after_it(
    transport_factory: TransportFactory, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = IngestionSettings(batch_size=2, concurrent_batches=1, linger_seconds=10)
    first_batch_held, release = asyncio.Event(), asyncio.Event()
    handed: list[list[Delivery]] = []

    async def handle(deliveries: list[Delivery]) -> None:
        handed.append(deliveries)
        first_batch_held.set()
        await release.wait()  # its write waits, as a held database would make it
        await deliveries[0].ack()  # the first committed, the second given back
        await deliveries[1].reject(requeue=True)

    caplog.set_level(logging.INFO, logger="controlroom.transport.batching")
    async with asyncio.timeout(TIMEOUT):
        async with transport_factory() as transport:
            for n in range(4):
                await transport.publish(queue_name, {"n": str(n)}, b"{}")
            async with Collector(transport, queue_name, prefetch=4) as consumer:
                deliveries = await consumer.get_many(4)
                scripted = _Scripted(deliveries, first_batch_held)
                batcher = DeliveryBatcher(scripted, queue_name, settings, handle)  # type: ignore[arg-type]
                run = asyncio.create_task(batcher.run(lambda: scripted.stopping))
                scripted.stop = run
                while not scripted.stopping:
                    await asyncio.sleep(0)
                for _ in range(50):  # ready callbacks only: the batcher's way to its end
                    await asyncio.sleep(0)
                finishing = [r.getMessage() for r in caplog.records if "ends:" in r.getMessage()]
                release.set()
                with contextlib.suppress(asyncio.CancelledError):
                    await run

    assert finishing == [
        f"the intake of {queue_name!r} ends: finishing 1 batch in hand (2 messages)"
    ]
    # Fresh user's pass (session 31): nothing said the batches in hand were stored.
    assert [r.getMessage() for r in caplog.records if "ended:" in r.getMessage()] == [
        f"the intake of {queue_name!r} ended: 1 of the 2 messages in hand stored and "
        "acknowledged, 1 left to the queue"
    ]
    assert handed == [deliveries[:2]]  # no batch started after the stop
