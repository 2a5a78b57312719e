"""Fixtures and helpers of the retry tests: stored failed messages, the API, a processor,
and waiting on the store with hard timeouts. Every fixture runs on each provider."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_retries,
    failed_messages,
    retry_batches,
)
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from controlroom.errors.retries.processor import RetryProcessor
from controlroom.transport.base import Delivery, Transport
from tests.nsb import failed_headers
from tests.transport.helpers import Collector

TIMEOUT = 60  # seconds: every wait in these tests gives up after this


def store_failed(
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    headers: Mapping[str, str | None],
    body: bytes = b"{}",
) -> FailedAttempt:
    """Ingest one failed message as the pipeline does: external body first, then the row."""
    attempt = parse_failed_message(
        headers, body, max_body_size_to_store=settings.max_body_size_to_store
    )
    if attempt.body_key is not None:
        body_store.put(attempt.body_key, attempt.body)
    writer.write(IngestionBatch(attempts=[attempt]))
    return attempt


def store_many(
    settings: Settings,
    writer: FailedMessageBatchWriter,
    count: int,
    *,
    prefix: str = "order",
    **header_options: Any,
) -> list[str]:
    """Store ``count`` failed messages with inline bodies; returns their ids, sorted."""
    attempts = [
        parse_failed_message(
            failed_headers(f"{prefix}-{n}", **header_options),
            f'{{"n": {n}}}'.encode(),
            max_body_size_to_store=settings.max_body_size_to_store,
        )
        for n in range(count)
    ]
    writer.write(IngestionBatch(attempts=attempts))
    return sorted(attempt.unique_message_id for attempt in attempts)


def statuses(engine: sa.Engine) -> dict[str, FailedMessageStatus]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(failed_messages.c.id, failed_messages.c.status))
        return {row.id: FailedMessageStatus(row.status) for row in rows}


def claims(engine: sa.Engine) -> dict[str, sa.Row[Any]]:
    """Every claim by failed message id."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(failed_message_retries)).all()
    return {row.failed_message_id: row for row in rows}


def batch_statuses(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.scalars(sa.select(retry_batches.c.status)))


def batch_ids(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.scalars(sa.select(retry_batches.c.id)))


def set_status(engine: sa.Engine, message_id: str, status: FailedMessageStatus) -> None:
    """Put a message in ``status`` directly (e.g. Archived, which another feature sets)."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(failed_messages)
            .where(failed_messages.c.id == message_id)
            .values(status=int(status))
        )


def make_processor(
    settings: Settings,
    engine: sa.Engine,
    transport: Transport,
    body_store: FileSystemBodyStore,
    **options: Any,
) -> RetryProcessor:
    options.setdefault("poll_interval_seconds", 0.05)
    options.setdefault("lease_seconds", 2.0)
    options.setdefault("max_backoff_seconds", 0.2)
    return RetryProcessor(settings, engine, transport, body_store, **options)


async def wait_for(condition: Callable[[], bool], *, timeout: float = TIMEOUT) -> None:
    """Poll ``condition`` (run off the event loop: it may query the store) until true."""
    async with asyncio.timeout(timeout):
        while not await asyncio.to_thread(condition):
            await asyncio.sleep(0.05)


def wait_for_sync(condition: Callable[[], bool], *, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.05)


async def take(collector: Collector, count: int) -> list[Delivery]:
    """The next ``count`` deliveries of ``collector``, each acknowledged as it arrives
    (so that more than the prefetch can arrive)."""
    deliveries: list[Delivery] = []
    async with asyncio.timeout(TIMEOUT):
        while len(deliveries) < count:
            delivery = await collector.get(timeout=TIMEOUT)
            await delivery.ack()
            deliveries.append(delivery)
    return deliveries


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
