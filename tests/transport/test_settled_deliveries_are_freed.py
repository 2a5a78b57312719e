"""docs/decisions.md "What ingestion holds is bounded by bytes": a settled delivery, and its
body, is freed as soon as the batch lets it go, by reference counting alone. A delivery
whose transport callbacks refer back to it is a reference cycle, which only the cyclic
garbage collector frees, whenever it happens to run: bodies of batches long done stayed
in memory (27 messages of 8 MiB held while at most 7 were in flight)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import Iterator

import pytest

from controlroom.transport import Delivery
from controlroom.transport.base import ack_many
from tests.transport.helpers import TransportFactory

pytestmark = pytest.mark.anyio

TIMEOUT = 60  # seconds, per test


@contextlib.contextmanager
def no_cyclic_collection() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("settle", ["ack", "ack_many", "reject"])
async def test_a_settled_delivery_is_freed_without_the_cyclic_collector(
    transport_factory: TransportFactory, queue_name: str, settle: str
) -> None:
    async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
        await transport.publish(queue_name, {"n": "1"}, b"x" * 1024)
        with no_cyclic_collection():
            stream = transport.consume(queue_name, 10, max_bytes=1024 * 1024)
            async with contextlib.aclosing(stream):  # its frame holds the last delivery
                delivery: Delivery | None = await anext(stream)
                assert delivery is not None
                if settle == "ack":
                    await delivery.ack()
                elif settle == "ack_many":
                    await ack_many([delivery])
                else:
                    await delivery.reject(requeue=False)
                freed = weakref.ref(delivery)
                delivery = None
            await asyncio.sleep(0)
            assert freed() is None
