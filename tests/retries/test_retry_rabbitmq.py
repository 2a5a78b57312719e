"""Retries end to end on a real RabbitMQ, on every provider: a real endpoint fails a message,
Controlroom ingests it, an operator retries it over HTTP, the processor sends it back to
the queue it failed in, the endpoint processes it and confirms, and the failed message
ends Resolved (docs/design.md "Error instance: retries")."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.identity import deterministic_id
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.retries import wire as retry_wire
from controlroom.transport.base import Transport
from controlroom.transport.rabbitmq import RabbitMQTransport
from tests.retries.conftest import (
    TIMEOUT,
    batch_statuses,
    claims,
    make_processor,
    statuses,
    store_many,
    take,
    unique_name,
    wait_for,
)
from tests.retries.endpoint import MACHINE, FlakyEndpoint, producer_headers
from tests.transport.helpers import Collector

pytestmark = pytest.mark.rabbitmq

ONE_MB = 1024 * 1024


@pytest.fixture
def broker_settings(settings: Settings, rabbitmq_url: str) -> Settings:
    """Settings on RabbitMQ with an error queue of this test's own."""
    return settings.model_copy(
        update={"broker_url": rabbitmq_url, "error_queue": unique_name("error")}
    )


@contextlib.asynccontextmanager
async def ingesting(
    settings: Settings, engine: sa.Engine, transport: Transport, body_store: FileSystemBodyStore
) -> AsyncIterator[None]:
    """Controlroom's ingestion of the error queue, running for the block."""
    service = IngestionService(settings, engine, transport, body_store)
    task = asyncio.create_task(service.run())
    try:
        yield
        assert not task.done(), task.exception()
    finally:
        await service.stop()


def attempts_of(engine: sa.Engine, message_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(failed_messages.c.number_of_processing_attempts).where(
                failed_messages.c.id == message_id
            )
        ).scalar_one()


def expected_retry_headers(
    failed: dict[str, str | None], unique_id: str, settings: Settings, address: str
) -> dict[str, str | None]:
    """The headers docs/design.md "Error instance: retries" lists: the failed message's,
    minus the stripped prefixes, plus the retry headers ServiceControl's return-to-sender
    delivers (docs/decisions.md "A retry sends what ServiceControl's return-to-sender
    sends")."""
    stripped = (
        "NServiceBus.Retries",
        "NServiceBus.FailedQ",
        "NServiceBus.TimeOfFailure",
        "NServiceBus.ExceptionInfo.",
        "ServiceControl.EditOf",
    )
    kept = {name: value for name, value in failed.items() if not name.startswith(stripped)}
    return kept | {
        "ServiceControl.Retry.UniqueMessageId": unique_id,
        "ServiceControl.Retry.AcknowledgementQueue": settings.error_queue,
    }


BODIES = {
    "json": (b'{"orderId": 7, "note": "caf\xc3\xa9 \xe2\x82\xac"}', "application/json"),
    "binary": (bytes(range(256)) * 16, "application/octet-stream"),
    "1 MB": (b'{"lines": "' + b"x" * (ONE_MB - 14) + b'"}', "application/json"),
}


@pytest.mark.parametrize("kind", list(BODIES))
def test_retried_message_reaches_the_endpoint_exactly_and_ends_resolved(
    broker_settings: Settings,
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
    kind: str,
) -> None:
    settings = broker_settings
    body, content_type = BODIES[kind]
    queue = unique_name("Sales")
    address = f"{queue}@{MACHINE}"  # retries go to the queue part of queue@machine
    message_id = str(uuid.uuid4())
    unique_id = deterministic_id(message_id + queue)
    client = TestClient(create_app(settings, engine, body_store))

    async def scenario() -> FlakyEndpoint:
        async with (
            RabbitMQTransport(settings.broker_url) as transport,
            ingesting(settings, engine, transport, body_store),
            FlakyEndpoint(transport, queue, settings.error_queue, address) as endpoint,
        ):
            await transport.publish(
                queue, producer_headers(message_id, content_type=content_type), body
            )
            await wait_for(
                lambda: statuses(engine).get(unique_id) == FailedMessageStatus.UNRESOLVED
            )

            response = await asyncio.to_thread(client.post, f"/api/errors/{unique_id}/retry")
            assert response.status_code == 202, response.text
            assert response.json()["message_count"] == 1
            assert statuses(engine)[unique_id] == FailedMessageStatus.RETRY_ISSUED

            processor = make_processor(settings, engine, transport, body_store)
            assert await processor.process_pending() == 1
            await processor.close()
            await wait_for(lambda: statuses(engine)[unique_id] == FailedMessageStatus.RESOLVED)
            return endpoint

    endpoint = asyncio.run(scenario())

    ((failed_headers, failed_body),) = endpoint.failures
    (retried,) = endpoint.processed
    assert retried.body == body == failed_body  # byte for byte, whatever the body was
    headers = dict(retried.headers)
    assert headers == expected_retry_headers(failed_headers, unique_id, settings, address)
    assert endpoint.confirmed == [True]
    assert claims(engine) == {}  # the confirmation removed the claim
    assert batch_statuses(engine) == ["done"]


def test_retry_that_fails_again_reopens_the_same_row_and_can_be_retried_again(
    broker_settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    settings = broker_settings
    queue = unique_name("Billing")
    message_id = str(uuid.uuid4())
    unique_id = deterministic_id(message_id + queue)
    client = TestClient(create_app(settings, engine, body_store))

    async def retry_and_forward(transport: Transport) -> None:
        response = await asyncio.to_thread(client.post, f"/api/errors/{unique_id}/retry")
        assert response.status_code == 202, response.text
        assert response.json()["message_count"] == 1
        processor = make_processor(settings, engine, transport, body_store)
        assert await processor.process_pending() == 1
        await processor.close()

    async def scenario() -> FlakyEndpoint:
        async with (
            RabbitMQTransport(settings.broker_url) as transport,
            ingesting(settings, engine, transport, body_store),
            FlakyEndpoint(transport, queue, settings.error_queue, queue, fail_times=2) as endpoint,
        ):
            await transport.publish(
                queue, producer_headers(message_id, content_type="text/xml"), b"<a/>"
            )
            await wait_for(
                lambda: statuses(engine).get(unique_id) == FailedMessageStatus.UNRESOLVED
            )

            await retry_and_forward(transport)  # the endpoint fails it again
            await wait_for(lambda: attempts_of(engine, unique_id) == 2)
            assert statuses(engine) == {unique_id: FailedMessageStatus.UNRESOLVED}  # same row

            await retry_and_forward(transport)  # now the endpoint processes it
            await wait_for(lambda: statuses(engine)[unique_id] == FailedMessageStatus.RESOLVED)
            return endpoint

    endpoint = asyncio.run(scenario())

    first_failure, second_failure = (headers for headers, _ in endpoint.failures)
    (processed,) = endpoint.processed
    assert second_failure["ServiceControl.Retry.UniqueMessageId"] == unique_id
    assert "ServiceControl.Retry.Attempt.MessageId" not in processed.headers
    assert attempts_of(engine, unique_id) == 2
    assert "ServiceControl.Retry.UniqueMessageId" not in first_failure


def test_concurrent_overlapping_retry_requests_send_every_message_exactly_once(
    broker_settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    settings = broker_settings
    queue = unique_name("Shipping")
    ids = store_many(settings, writer, 1500, endpoint=queue)
    selections = [ids[:1000], ids[500:]]  # 500 messages in both
    app = create_app(settings, engine, body_store)
    barrier = threading.Barrier(len(selections))
    answers: list[dict[str, object]] = []
    errors: list[BaseException] = []

    def request(selection: list[str]) -> None:
        try:
            with TestClient(app) as client:
                barrier.wait(timeout=TIMEOUT)
                response = client.post("/api/errors/retry", json=selection)
                assert response.status_code == 202, response.text
                answers.append(response.json())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=request, args=(s,)) for s in selections]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert not errors, errors
    assert sum(a["message_count"] for a in answers) == 1500  # type: ignore[misc]
    assert sum(a["skipped_count"] for a in answers) == 500  # type: ignore[misc]
    assert set(statuses(engine).values()) == {FailedMessageStatus.RETRY_ISSUED}

    async def scenario() -> Counter[str]:
        async with (
            RabbitMQTransport(settings.broker_url) as transport,
            Collector(transport, queue, prefetch=100) as collector,
        ):
            processor = make_processor(settings, engine, transport, body_store)
            await processor.process_pending()
            await processor.close()
            deliveries = await take(collector, 1500)
            await collector.assert_idle(1.0)  # and nothing more
        return Counter(d.headers[retry_wire.RETRY_UNIQUE_MESSAGE_ID] or "" for d in deliveries)

    sent = asyncio.run(scenario())
    assert set(sent) == set(ids)
    assert set(sent.values()) == {1}
