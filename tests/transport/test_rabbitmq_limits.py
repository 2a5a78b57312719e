"""Issue 14 on a real RabbitMQ: a URL naming a missing virtual host gives a one-line error
that says so (item 18)."""

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
    """Item 9: publishes racing to declare queues that do not exist yet."""
    queues = [f"new-{uuid.uuid4().hex[:10]}" for _ in range(24)]

    async def scenario() -> list[int]:
        async with RabbitMQTransport(rabbitmq_url) as transport:
            await asyncio.gather(
                *(transport.publish(queue, {"n": str(n)}, b"x") for n, queue in enumerate(queues))
            )
            await transport.check()  # the connection survived
            return [await transport.purge(queue) for queue in queues]

    assert asyncio.run(scenario()) == [1] * len(queues)
