"""Ingestion from a real RabbitMQ error queue, per provider."""

from __future__ import annotations

import asyncio
import uuid

import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import failed_error_imports, failed_messages
from controlroom.transport.rabbitmq import RabbitMQTransport
from tests.factories import at
from tests.integration.test_ingestion import count, ingest_until, publish_all
from tests.nsb import failed_headers


def test_rabbitmq_error_queue_is_drained_into_rows_and_acknowledged(
    settings: Settings, engine: sa.Engine, rabbitmq_url: str
) -> None:
    settings = settings.model_copy(
        update={"broker_url": rabbitmq_url, "error_queue": f"error-{uuid.uuid4().hex[:8]}"}
    )
    messages = [
        (failed_headers(f"order-{n % 40}", failed_at=at(n)), f'{{"n": {n}}}'.encode())
        for n in range(120)
    ]
    messages.append(({"NServiceBus.MessageId": "no-failed-q"}, b"\xff\xfe"))

    async def scenario() -> int:
        async with RabbitMQTransport(rabbitmq_url) as transport:
            await publish_all(transport, settings.error_queue, messages)
            await ingest_until(
                settings,
                engine,
                transport,
                lambda: (
                    count(engine, failed_messages) == 40
                    and count(engine, failed_error_imports) == 1
                ),
            )
        # A fresh connection: anything not acknowledged is back in the queue by now.
        async with RabbitMQTransport(rabbitmq_url) as transport:
            return await transport.purge(settings.error_queue)

    assert asyncio.run(scenario()) == 0
    with engine.connect() as conn:
        counts = (
            conn.execute(sa.select(failed_messages.c.number_of_processing_attempts)).scalars().all()
        )
    assert sorted(counts) == [3] * 40


def test_amqp_content_encoding_makes_the_body_binary(
    settings: Settings, engine: sa.Engine, rabbitmq_url: str
) -> None:
    import aio_pika

    queue = f"error-{uuid.uuid4().hex[:8]}"
    settings = settings.model_copy(update={"broker_url": rabbitmq_url, "error_queue": queue})
    headers = failed_headers("gzipped")

    async def scenario() -> None:
        async with RabbitMQTransport(rabbitmq_url) as transport:
            await transport.publish(queue, {}, b"")  # declares the queue
            await transport.purge(queue)
            connection = await aio_pika.connect(rabbitmq_url)
            async with connection:
                channel = await connection.channel()
                await channel.default_exchange.publish(
                    aio_pika.Message(b"\x1f\x8b{}", headers=headers, content_encoding="gzip"),
                    routing_key=queue,
                )
            await ingest_until(
                settings, engine, transport, lambda: count(engine, failed_messages) == 1
            )

    asyncio.run(scenario())
    with engine.connect() as conn:
        row = conn.execute(sa.select(failed_messages)).one()
    assert row.body_stored_externally is True
    assert row.body_text is None
