"""RabbitMQ's limits on a real broker: a URL naming a missing virtual host gives a one-line
error that says so (docs/decisions.md "Configuration errors fit on one line"), and queues
are declared one at a time."""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from controlroom.transport import RabbitMQTransport, TransportError

pytestmark = pytest.mark.rabbitmq


def test_a_missing_virtual_host_is_named_in_one_line(rabbitmq_url: str) -> None:
    vhost = f"missing-{uuid.uuid4().hex[:8]}"
    url = urlunsplit(urlsplit(rabbitmq_url)._replace(path=f"/{vhost}"))

    async def start() -> None:
        async with RabbitMQTransport(url):
            pass

    with pytest.raises(TransportError) as raised:
        asyncio.run(start())

    message = str(raised.value)
    assert "\n" not in message
    assert f"virtual host '{vhost}'" in message and "does not exist" in message
    assert "guest:guest" not in message


def test_concurrent_publishes_to_new_queues_all_arrive_on_one_connection(
    rabbitmq_url: str,
) -> None:
    """docs/decisions.md "RabbitMQ queues are declared one at a time": publishes racing to declare
    queues that do not exist yet."""
    queues = [f"new-{uuid.uuid4().hex[:10]}" for _ in range(24)]

    async def scenario() -> list[int]:
        async with RabbitMQTransport(rabbitmq_url) as transport:
            await asyncio.gather(
                *(transport.publish(queue, {"n": str(n)}, b"x") for n, queue in enumerate(queues))
            )
            await transport.check()  # the connection survived
            return [await transport.purge(queue) for queue in queues]

    assert asyncio.run(scenario()) == [1] * len(queues)


def test_headers_larger_than_a_frame_are_refused_and_the_connection_stays(
    rabbitmq_url: str,
) -> None:
    """A content header (properties and header table) is one frame: larger than the
    negotiated ``frame_max`` (131072 bytes by default), the broker closed the whole
    connection (FRAME_ERROR) and every consumer on it dropped. ``publish`` refuses it with
    ``ValueError`` before sending anything; a header set that fits still goes out, and a
    consumer on the same connection keeps receiving."""
    queue = f"frame-{uuid.uuid4().hex[:10]}"

    async def scenario() -> list[str | None]:
        received: list[str | None] = []
        async with asyncio.timeout(60), RabbitMQTransport(rabbitmq_url) as transport:
            await transport.publish(queue, {"n": "before"}, b"1")
            consumer = transport.consume(queue, 10)
            first = await anext(consumer)
            received.append(first.headers["n"])
            await first.ack()
            with pytest.raises(ValueError, match="frame"):
                await transport.publish(queue, {"n": "big", "X-Big": "b" * 200_000}, b"2")
            # The largest header the check lets through is one the broker takes.
            fits = await largest_accepted(transport, f"{queue}-sink", 100_000, 200_000)
            await transport.publish(queue, {"n": "fits", "X-Big": "b" * fits}, b"3")
            await transport.publish(queue, {"n": "after"}, b"4")
            for _ in range(2):
                delivery = await anext(consumer)
                received.append(delivery.headers["n"])
                await delivery.ack()
            await transport.check()
            await consumer.aclose()
        return received

    assert asyncio.run(scenario()) == ["before", "fits", "after"]


async def largest_accepted(transport: RabbitMQTransport, queue: str, low: int, high: int) -> int:
    """The longest ``X-Big`` header value ``publish`` accepts next to ``n: fits``, between
    ``low`` (accepted) and ``high`` (refused); what it accepts goes to ``queue``, purged
    afterwards."""
    while high - low > 1:
        middle = (low + high) // 2
        try:
            await transport.publish(queue, {"n": "fits", "X-Big": "b" * middle}, b"")
        except ValueError:
            high = middle
        else:
            low = middle
    await transport.purge(queue)
    return low
