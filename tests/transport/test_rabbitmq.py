"""RabbitMQ-only behaviour: header decoding, coexisting with NServiceBus-declared queues,
recovery after a lost connection (through a proxy that cuts it)."""

from __future__ import annotations

import asyncio
import datetime
import decimal
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import pytest

from controlroom.transport import DeliveryLostError, RabbitMQTransport, TransportError
from controlroom.transport.rabbitmq import decode_headers, redact_url
from tests.transport.helpers import Collector
from tests.transport.proxy import TcpProxy

TIMEOUT = 60  # seconds, per test


# -- pure functions -------------------------------------------------------------------


def test_decode_headers_turns_every_amqp_type_into_text_or_none() -> None:
    raw = {
        "text": "Grüße",
        "long string that was not utf-8": b"caf\xe9",
        "byte array": bytearray("ünï".encode()),
        "void": None,
        "int": 42,
        "bool": True,
        "float": 1.5,
        "decimal": decimal.Decimal("12.50"),
        "timestamp": datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.UTC),
        "table": {"a": [1, b"x", None], "b": "y"},
    }
    assert decode_headers(raw) == {
        "text": "Grüße",
        "long string that was not utf-8": "caf\udce9",  # the byte kept, for a failed import
        "byte array": "ünï",
        "void": None,
        "int": "42",
        "bool": "True",
        "float": "1.5",
        "decimal": "12.50",
        "timestamp": "2024-05-01T12:30:00+00:00",
        "table": '{"a":[1,"x",null],"b":"y"}',
    }
    assert decode_headers(None) == {}


def test_redact_url_hides_only_the_password() -> None:
    assert redact_url("amqp://guest:s3cret@host:5672/vh") == "amqp://guest:***@host:5672/vh"
    assert redact_url("amqp://host/") == "amqp://host/"


# -- against the broker ----------------------------------------------------------------


@pytest.fixture
async def raw_channel(rabbitmq_url: str) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    """A plain aio-pika channel on the test vhost, playing NServiceBus or an operator."""
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        yield await connection.channel()
    finally:
        await connection.close()


@pytest.mark.anyio
@pytest.mark.rabbitmq
async def test_start_failure_names_the_broker_without_the_password() -> None:
    transport = RabbitMQTransport("amqp://guest:s3cret@127.0.0.1:1/")
    with pytest.raises(TransportError) as info:
        async with asyncio.timeout(TIMEOUT):
            await transport.start()
    assert "127.0.0.1:1" in str(info.value)
    assert "s3cret" not in str(info.value)


@pytest.mark.anyio
@pytest.mark.rabbitmq
async def test_publish_declares_a_durable_queue_and_sends_persistent_messages(
    rabbitmq_url: str, queue_name: str, raw_channel: aio_pika.abc.AbstractChannel
) -> None:
    async with asyncio.timeout(TIMEOUT), RabbitMQTransport(rabbitmq_url) as transport:
        await transport.publish(
            queue_name, {"h": "v"}, b"{}", message_id="m-1", content_type="application/json"
        )
        # A non-passive durable declare without arguments succeeds only on an equal queue.
        queue = await raw_channel.declare_queue(queue_name, durable=True)
        message = await queue.get(timeout=5)
        assert message is not None
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert (message.message_id, message.content_type) == ("m-1", "application/json")
        assert message.headers == {"h": "v"}
        await message.ack()


@pytest.mark.anyio
@pytest.mark.rabbitmq
@pytest.mark.parametrize(
    "arguments",
    [
        {"x-queue-type": "quorum"},  # NServiceBus 8's default queue type
        {"x-queue-type": "classic", "x-max-length": 1000},
    ],
    ids=["quorum", "classic-with-arguments"],
)
async def test_works_with_a_queue_nservicebus_declared_with_its_own_arguments(
    rabbitmq_url: str,
    queue_name: str,
    raw_channel: aio_pika.abc.AbstractChannel,
    arguments: dict[str, object],
) -> None:
    async with asyncio.timeout(TIMEOUT):
        await raw_channel.declare_queue(queue_name, durable=True, arguments=arguments)
        async with RabbitMQTransport(rabbitmq_url) as transport:
            await transport.publish(queue_name, {"n": "1"}, b"one")
            async with Collector(transport, queue_name, prefetch=5) as consumer:
                delivery = await consumer.get()
                assert delivery.body == b"one"
                await delivery.ack()
            assert await transport.purge(queue_name) == 0
            await transport.check()


@pytest.mark.anyio
@pytest.mark.rabbitmq
async def test_consumes_what_an_nservicebus_style_sender_publishes(
    rabbitmq_url: str, queue_name: str, raw_channel: aio_pika.abc.AbstractChannel
) -> None:
    async with asyncio.timeout(TIMEOUT):
        await raw_channel.declare_queue(queue_name, durable=True)
        await raw_channel.default_exchange.publish(
            aio_pika.Message(
                b"<xml/>",
                headers={
                    "NServiceBus.FailedQ": bytearray(b"Sales"),  # byte-array header
                    "NServiceBus.ReplyToAddress": None,
                    "NServiceBus.Retries": 3,
                },
                message_id="id-from-property",
            ),
            routing_key=queue_name,
        )
        async with (
            RabbitMQTransport(rabbitmq_url) as transport,
            Collector(transport, queue_name, prefetch=1) as consumer,
        ):
            delivery = await consumer.get()
            assert delivery.headers == {
                "NServiceBus.FailedQ": "Sales",
                "NServiceBus.ReplyToAddress": None,
                "NServiceBus.Retries": "3",
                "NServiceBus.MessageId": "id-from-property",
            }
            await delivery.ack()


@pytest.mark.anyio
@pytest.mark.rabbitmq
async def test_publish_redeclares_a_queue_deleted_behind_its_back(
    rabbitmq_url: str, queue_name: str, raw_channel: aio_pika.abc.AbstractChannel
) -> None:
    async with asyncio.timeout(TIMEOUT), RabbitMQTransport(rabbitmq_url) as transport:
        await transport.publish(queue_name, {}, b"first")
        await raw_channel.queue_delete(queue_name)
        await transport.publish(queue_name, {}, b"second")  # unroutable -> declare, resend
        async with Collector(transport, queue_name, prefetch=1) as consumer:
            delivery = await consumer.get()
            assert delivery.body == b"second"
            await delivery.ack()


@pytest.mark.anyio
@pytest.mark.rabbitmq
async def test_a_consumer_the_broker_cancels_ends_the_consume_with_an_error(
    rabbitmq_url: str, queue_name: str, raw_channel: aio_pika.abc.AbstractChannel
) -> None:
    """Second breaker pass: deleting the error queue made RabbitMQ cancel the consumer;
    the intake waited for deliveries that could never come, health said ok, and what was
    published after the queue was declared again stayed unread. The consume now fails, so
    its intake ends (a worker is restarted, and consuming again declares the queue)."""
    async with asyncio.timeout(TIMEOUT), RabbitMQTransport(rabbitmq_url) as transport:
        stream = transport.consume(queue_name, prefetch=1)
        await transport.publish(queue_name, {}, b"before")
        delivery = await anext(stream)
        await delivery.ack()
        await raw_channel.queue_delete(queue_name)
        with pytest.raises(TransportError, match="cancelled the consumer"):
            await anext(stream)
        await stream.aclose()
        async with Collector(transport, queue_name, prefetch=1) as consumer:
            await transport.publish(queue_name, {}, b"after")
            delivery = await consumer.get()
            assert delivery.body == b"after"
            await delivery.ack()


@pytest.fixture
async def proxy(rabbitmq_url: str) -> AsyncIterator[TcpProxy]:
    broker = urlsplit(rabbitmq_url)
    proxy = TcpProxy(broker.hostname or "127.0.0.1", broker.port or 5672)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


@pytest.mark.anyio
@pytest.mark.rabbitmq
async def test_publish_without_a_confirm_in_time_fails_as_outcome_unknown(
    rabbitmq_url: str, queue_name: str, proxy: TcpProxy
) -> None:
    url = _via_proxy(rabbitmq_url, proxy.port)
    async with (
        asyncio.timeout(TIMEOUT),
        RabbitMQTransport(url, publish_timeout_seconds=0.5) as transport,
    ):
        await transport.publish(queue_name, {}, b"declares the queue")
        proxy.flowing.clear()  # the broker stalls
        with pytest.raises(TransportError, match="outcome unknown"):
            await transport.publish(queue_name, {}, b"stalled")
        proxy.flowing.set()


def _via_proxy(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{parts.password}@127.0.0.1:{port}"
    # A short reconnect interval keeps the test fast; aio-pika reads it from the URL.
    return urlunsplit(parts._replace(netloc=netloc, query="reconnect_interval=1"))


async def _until_check(transport: RabbitMQTransport, *, healthy: bool) -> None:
    """Poll ``check()`` until it reports ``healthy`` (the caller holds the timeout)."""
    while True:
        try:
            await transport.check()
            ok = True
        except TransportError:
            ok = False
        if ok is healthy:
            return
        await asyncio.sleep(0.02)


@pytest.mark.anyio
@pytest.mark.rabbitmq
async def test_recovers_consumer_and_publisher_after_the_connection_is_cut(
    rabbitmq_url: str, queue_name: str, proxy: TcpProxy
) -> None:
    async with (
        asyncio.timeout(TIMEOUT),
        RabbitMQTransport(_via_proxy(rabbitmq_url, proxy.port)) as transport,
        Collector(transport, queue_name, prefetch=10) as consumer,
    ):
        await transport.publish(queue_name, {"n": "1"}, b"before")
        held = await consumer.get()

        proxy.refusing = True  # the broker stays "down" until we say so
        proxy.cut()
        await _until_check(transport, healthy=False)
        with pytest.raises(DeliveryLostError):
            await held.ack()  # its channel died with the connection
        with pytest.raises(TransportError):
            await transport.publish(queue_name, {}, b"during the outage")

        proxy.refusing = False
        await _until_check(transport, healthy=True)
        again = await consumer.get(timeout=20)  # the restored consumer gets it back
        assert (again.headers, again.body) == (held.headers, b"before")
        await again.ack()

        await transport.publish(queue_name, {"n": "2"}, b"after")
        after = await consumer.get()
        assert after.body == b"after"
        await after.ack()
        await consumer.assert_idle(0.5)
