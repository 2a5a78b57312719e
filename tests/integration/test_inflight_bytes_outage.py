"""docs/decisions.md "What ingestion holds is bounded by bytes": during a database outage, with
large messages queued, what ingestion holds unacknowledged is bounded by
``ingestion.max_inflight_bytes`` (plus one message), not by prefetch x message size. On the embedded
queue and on RabbitMQ; what is held is read from the queue itself (leased rows, the broker's
unacknowledged count). On RabbitMQ what the broker pushed into the process (every delivery the
consumer received, including those it gave back) is bounded too, not only what is held once the
pause settled.

The outage is a PostgreSQL URL nobody listens on: every write fails as transient and the
pipeline backs off, holding its batch."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from pathlib import Path

import pytest
from aio_pika.abc import AbstractIncomingMessage

from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.transport import EmbeddedQueue, RabbitMQTransport, Transport
from controlroom.transport._amqp_consumer import ConsumerSession
from controlroom.transport.base import message_size
from tests import servers
from tests.integration.test_ingestion import publish_all
from tests.nsb import failed_headers

MIB = 1024 * 1024
BOUND = 1 * MIB
BODY = 300 * 1024
UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:9/controlroom"  # discard port


def leased_bytes(queue_file: Path) -> tuple[int, int]:
    """(messages, stored bytes) of the embedded queue's leased messages."""
    with contextlib.closing(sqlite3.connect(queue_file)) as conn:
        count, size = conn.execute(
            "SELECT count(*), coalesce(sum(length(body) + length(headers_json)), 0) "
            "FROM queue_messages JOIN queue_bodies USING (id) WHERE lease_owner IS NOT NULL"
        ).fetchone()
    return int(count), int(size)


@pytest.mark.parametrize("kind", ["embedded", "rabbitmq"])
def test_a_database_outage_holds_at_most_the_byte_bound(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = f"error-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=UNREACHABLE,
        error_queue=queue,
        ingestion={"max_inflight_bytes": BOUND, "max_backoff_seconds": 0.2, "linger_seconds": 0.2},
    )
    messages = [(failed_headers(f"large-{n}"), b"x" * BODY) for n in range(30)]
    one = message_size(*messages[0])
    rabbitmq_url = request.getfixturevalue("rabbitmq_url") if kind == "rabbitmq" else ""
    pushed: list[int] = []  # body sizes of what the broker pushed to the consumer
    receive = ConsumerSession._on_message

    async def counting(self: ConsumerSession, message: AbstractIncomingMessage) -> None:
        pushed.append(len(message.body))
        await receive(self, message)

    monkeypatch.setattr(ConsumerSession, "_on_message", counting)

    def held() -> int:
        """Messages the consumer holds, as the queue counts them."""
        if kind == "embedded":
            count, size = leased_bytes(settings.embedded_queue_path)
            assert size <= BOUND + (size // max(count, 1))  # stored bytes: bound + one
            return count
        return servers.rabbitmq_queue_counts(rabbitmq_url, queue)[1]

    def transport() -> Transport:
        if kind == "embedded":
            return EmbeddedQueue(settings.embedded_queue_path)
        return RabbitMQTransport(rabbitmq_url)

    async def scenario() -> list[int]:
        engine = create_store_engine(UNREACHABLE)
        async with transport() as queue_transport:
            await publish_all(queue_transport, queue, messages)
            service = IngestionService(
                settings, engine, queue_transport, FileSystemBodyStore(settings.body_dir)
            )
            task = asyncio.create_task(service.run())
            samples: list[int] = []
            try:
                async with asyncio.timeout(60):
                    while len(samples) < 4:
                        assert not task.done(), task.exception()
                        await asyncio.sleep(0.5)
                        count = await asyncio.to_thread(held)
                        if count or samples:
                            samples.append(count)
            finally:
                await service.stop()
                engine.dispose()
            return samples

    samples = asyncio.run(scenario())
    most = BOUND // one + 1  # what fits, plus the one message that may exceed it
    assert 0 < max(samples) <= most, (samples, most)
    if kind == "rabbitmq":  # the prefetch (400) would let all 30 (9 MB) in at once
        assert 0 < sum(pushed) <= 2 * BOUND + BODY, (len(pushed), sum(pushed))
