"""docs/decisions.md "A refused retry is given up after five sends", on a real RabbitMQ,
per provider: a destination queue that refuses every
publish (``x-max-length=0``, ``x-overflow=reject-publish``) costs its retry batch at most
``MAX_SEND_ATTEMPTS`` sends; then the messages are Unresolved again with the reason in the
event log and on the operation, and later batches go out meanwhile."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
import sqlalchemy as sa

from controlroom import events
from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.retries import requests as retries
from controlroom.errors.retries.processor import MAX_SEND_ATTEMPTS
from controlroom.transport.rabbitmq import RabbitMQTransport
from tests.nsb import failed_headers
from tests.retries.conftest import claims, make_processor, statuses, store_failed, unique_name
from tests.retries.conftest import wait_for as wait_until
from tests.transport.helpers import Collector

pytestmark = pytest.mark.rabbitmq


async def declare_refusing_queue(url: str, name: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(
            name,
            durable=True,
            arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
        )


def completed(engine: sa.Engine, operation_id: str) -> bool:
    with engine.connect() as conn:
        operation = retries.get_operation(conn, operation_id)
    return operation is not None and operation.completed_at is not None


def test_a_refusing_queue_gives_up_after_bounded_attempts_and_later_batches_go_out(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    rabbitmq_url: str,
) -> None:
    settings = settings.model_copy(update={"broker_url": rabbitmq_url})
    refusing, fine = unique_name("Refusing"), unique_name("Fine")
    stuck = store_failed(settings, writer, body_store, failed_headers("stuck", endpoint=refusing))
    later = store_failed(settings, writer, body_store, failed_headers("later", endpoint=fine))
    first = retries.retry_message(engine, stuck.unique_message_id)
    second = retries.retry_message(engine, later.unique_message_id)

    async def scenario() -> None:
        await declare_refusing_queue(rabbitmq_url, refusing)
        async with RabbitMQTransport(rabbitmq_url) as transport:
            processor = make_processor(settings, engine, transport, body_store)
            running = asyncio.create_task(processor.run())
            try:
                async with Collector(transport, fine, prefetch=10) as collector:
                    delivery = await collector.get(timeout=30)
                    await delivery.ack()
                    assert delivery.headers["NServiceBus.MessageId"] == "later"
                # Giving up (status, claims, reason) and finishing the batch are two
                # transactions: wait for the operation to complete, not only the status.
                await wait_until(lambda: completed(engine, first.operation_id), timeout=30)
            finally:
                running.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await running

    asyncio.run(scenario())

    assert statuses(engine)[stuck.unique_message_id] is FailedMessageStatus.UNRESOLVED
    assert stuck.unique_message_id not in claims(engine)
    with engine.connect() as conn:
        operation = retries.get_operation(conn, first.operation_id)
        logged = events.list_events(conn, offset=0, limit=50).items
        done = retries.get_operation(conn, second.operation_id)
    assert operation is not None and operation.failed and operation.completed_at is not None
    assert operation.failure_reason and "did not accept" in operation.failure_reason
    assert done is not None and done.forwarded_count == 1 and not done.failed
    given_up = [item for item in logged if item.event_type == "RetryBatchGivenUp"]
    assert len(given_up) == 1 and given_up[0].severity == "error"
    assert f"after {MAX_SEND_ATTEMPTS} failed sends" in given_up[0].description
