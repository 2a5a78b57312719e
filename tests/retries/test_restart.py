"""A retry batch survives its process: killed after staging and before forwarding, or
failing mid-forwarding, it completes on the next run; nothing claimed is lost or left
RetryIssued (docs/decisions.md "Retries are staged, then forwarded, and survive a restart").
Every provider."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlroom.client import confirm_successful_retry
from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, retry_operations
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.retries import requests as retries
from controlroom.errors.retries import wire as retry_wire
from controlroom.errors.retries.processor import RetryProcessor
from controlroom.transport.base import Transport, TransportError
from controlroom.transport.embedded import EmbeddedQueue
from controlroom.transport.rabbitmq import RabbitMQTransport
from tests.nsb import failed_headers
from tests.retries.conftest import (
    TIMEOUT,
    batch_statuses,
    claims,
    make_processor,
    statuses,
    store_failed,
    take,
    unique_name,
    wait_for,
    wait_for_sync,
)
from tests.transport.helpers import Collector

REPO = Path(__file__).resolve().parents[2]


def store_mixed(
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    queue: str,
) -> dict[str, bytes]:
    """Failed messages with inline, external text and binary bodies; id -> body."""
    bodies = {
        "inline": b'{"n": 1}',
        "large": b'{"big": "' + b"y" * (settings.max_body_size_to_store + 10) + b'"}',
        "binary": b"\x00\x01\xfe\xff" * 100,
    }
    stored = {}
    for n, (name, body) in enumerate(bodies.items()):
        content_type = "application/octet-stream" if name == "binary" else "application/json"
        headers = failed_headers(f"{name}-{n}", endpoint=queue, content_type=content_type)
        attempt = store_failed(settings, writer, body_store, headers, body)
        stored[attempt.unique_message_id] = body
    return stored


async def confirm_and_ingest(
    settings: Settings,
    engine: sa.Engine,
    transport: Transport,
    body_store: FileSystemBodyStore,
    deliveries: list,
) -> None:
    """The endpoint processed every delivery: confirm each, ingest until all Resolved."""
    for delivery in deliveries:
        assert await confirm_successful_retry(transport, delivery.headers)
    service = IngestionService(settings, engine, transport, body_store)
    task = asyncio.create_task(service.run())
    try:
        await wait_for(lambda: set(statuses(engine).values()) == {FailedMessageStatus.RESOLVED})
    finally:
        await service.stop()
    assert task.cancelled()


@pytest.mark.rabbitmq
def test_processor_killed_after_staging_completes_the_batch_on_restart(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    rabbitmq_url: str,
    tmp_path: Path,
) -> None:
    settings = settings.model_copy(
        update={"broker_url": rabbitmq_url, "error_queue": unique_name("error")}
    )
    queue = unique_name("Sales")
    stored = store_mixed(settings, writer, body_store, queue)
    retries.retry_all(engine)
    marker = tmp_path / "staged"
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.retries.crashing_processor",
            json.dumps(settings.model_dump(mode="json")),
            str(marker),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        wait_for_sync(lambda: marker.exists() or child.poll() is not None)
        assert child.poll() is None, "the child died before staging"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(TIMEOUT)

    # Killed between staging and forwarding: staged, nothing sent, still RetryIssued.
    assert batch_statuses(engine) == ["forwarding"]
    held = claims(engine)
    assert sorted(held) == sorted(stored)
    assert all(c.attempt_message_id and c.sent_at is None for c in held.values())
    staged_attempts = {i: c.attempt_message_id for i, c in held.items()}

    async def restart() -> list:
        async with (
            RabbitMQTransport(rabbitmq_url) as transport,
            Collector(transport, queue, prefetch=10) as collector,
        ):
            processor = make_processor(settings, engine, transport, body_store)
            task = asyncio.create_task(processor.run())  # waits out the dead one's lease
            try:
                await wait_for(lambda: batch_statuses(engine) == ["done"])
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            deliveries = await take(collector, len(stored))
            await collector.assert_idle(0.5)
            await confirm_and_ingest(settings, engine, transport, body_store, deliveries)
            return deliveries

    deliveries = asyncio.run(restart())

    by_id = {d.headers[retry_wire.RETRY_UNIQUE_MESSAGE_ID]: d for d in deliveries}
    assert {i: d.body for i, d in by_id.items()} == stored  # nothing lost, bytes intact
    # The attempt ids persisted at staging are bookkeeping, never sent (docs/decisions.md
    # "A retry sends what ServiceControl's return-to-sender sends").
    assert staged_attempts and all(
        retry_wire.RETRY_ATTEMPT_MESSAGE_ID not in d.headers for d in by_id.values()
    )
    assert claims(engine) == {}
    with engine.connect() as conn:
        operation = conn.execute(sa.select(retry_operations)).one()
    assert (operation.forwarded_count, operation.completed_at is not None) == (3, True)


class FailingPublishes:
    """A transport whose ``publish`` fails (TransportError) for the ``nth`` call."""

    def __init__(self, inner: Transport, nth: int) -> None:
        self._inner = inner
        self._calls = 0
        self._nth = nth

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def publish(
        self, queue: str, headers: Mapping[str, str | None], body: bytes, **kw: object
    ) -> None:
        self._calls += 1
        if self._calls == self._nth:
            raise TransportError("broker gone (injected)")
        await self._inner.publish(queue, headers, body, **kw)  # type: ignore[arg-type]


def test_failure_between_staging_and_forwarding_and_mid_forwarding_loses_nothing(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    queue = unique_name("Billing")
    stored = store_mixed(settings, writer, body_store, queue)
    retries.retry_all(engine)

    class BrokenAfterStaging(RetryProcessor):
        async def _forward(self, batch_id: str) -> None:
            raise RuntimeError("process dies here (injected)")

    async def scenario() -> list:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            crashed = BrokenAfterStaging(settings, engine, transport, body_store)
            with pytest.raises(RuntimeError):
                await crashed.process_pending()
            await crashed.close()
            assert batch_statuses(engine) == ["forwarding"]
            assert set(statuses(engine).values()) == {FailedMessageStatus.RETRY_ISSUED}

            failing: Transport = FailingPublishes(transport, 2)  # type: ignore[assignment]
            flaky = make_processor(settings, engine, failing, body_store)
            with pytest.raises(TransportError):
                await flaky.process_pending()
            await flaky.close()
            sent = sum(c.sent_at is not None for c in claims(engine).values())
            assert sent == 2 and batch_statuses(engine) == ["forwarding"]

            healthy = make_processor(settings, engine, transport, body_store)
            assert await healthy.process_pending() == 1
            await healthy.close()
            async with Collector(transport, queue, prefetch=10) as collector:
                deliveries = await take(collector, len(stored))
                await collector.assert_idle(0.5)
            await confirm_and_ingest(settings, engine, transport, body_store, deliveries)
            return deliveries

    deliveries = asyncio.run(scenario())

    received = Counter(d.headers[retry_wire.RETRY_UNIQUE_MESSAGE_ID] for d in deliveries)
    assert received == Counter(list(stored))  # each exactly once: sent marks follow the confirms
    assert {d.headers[retry_wire.RETRY_UNIQUE_MESSAGE_ID]: d.body for d in deliveries} == stored
    assert batch_statuses(engine) == ["done"]
