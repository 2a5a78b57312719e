"""docs/decisions.md "Metrics are labelled by route template" and "serve says what it is
doing": ``/metrics`` shows the error queue's depth (and its lag where
the transport tells it), labelled by queue name, and the periodic ingestion line says it;
per provider, on the embedded queue and on RabbitMQ."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.transport import EmbeddedQueue, RabbitMQTransport, Transport
from tests.integration.test_ingestion import publish_all
from tests.nsb import failed_headers


@pytest.fixture(params=["embedded", "rabbitmq"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_transport(kind: str, settings: Settings, request: pytest.FixtureRequest) -> Transport:
    if kind == "embedded":
        return EmbeddedQueue(settings.embedded_queue_path)
    return RabbitMQTransport(request.getfixturevalue("rabbitmq_url"))


def test_metrics_and_the_ingestion_line_show_the_error_queue_depth(
    settings: Settings,
    engine: sa.Engine,
    client: TestClient,
    transport_kind: str,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = f"error-{uuid.uuid4().hex[:8]}"
    settings = settings.model_copy(update={"error_queue": queue})
    messages = [(failed_headers(f"waiting-{n}"), b"{}") for n in range(4)]

    async def scenario() -> None:
        async with make_transport(transport_kind, settings, request) as transport:
            await publish_all(transport, queue, messages)
            service = IngestionService(
                settings, engine, transport, FileSystemBodyStore(settings.body_dir)
            )
            await service.report()

    with caplog.at_level(logging.INFO, logger="controlroom.errors.ingest.pipeline"):
        asyncio.run(scenario())

    text = client.get("/metrics").text
    assert f'controlroom_queue_depth_messages{{queue="{queue}"}} 4.0' in text
    lag = f'controlroom_queue_lag_seconds{{queue="{queue}"}}'
    assert (lag in text) == (transport_kind == "embedded")
    assert any(f"4 waiting in {queue}" in r.getMessage() for r in caplog.records)


def test_the_ingestion_line_counts_the_seconds_since_the_last_one(
    settings: Settings, engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Fresh-user pass (sixth): a worker kept from the CPU for 35 s logged the messages of
    those 35 s as "in the last 10 s" (the configured interval), and a rate four times too
    high. The line counts the seconds that passed since the last (or since intake began)."""
    settings = settings.model_copy(
        update={"ingestion": settings.ingestion.model_copy(update={"report_interval_seconds": 60})}
    )

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await publish_all(transport, settings.error_queue, [(failed_headers("w"), b"{}")])
            service = IngestionService(
                settings, engine, transport, FileSystemBodyStore(settings.body_dir)
            )
            await asyncio.sleep(1.2)
            await service.report()

    with caplog.at_level(logging.INFO, logger="controlroom.errors.ingest.pipeline"):
        asyncio.run(scenario())

    [line] = [r.getMessage() for r in caplog.records if "1 waiting in" in r.getMessage()]
    assert f"from {settings.error_queue} in the last 1 s;" in line
