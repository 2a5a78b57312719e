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
