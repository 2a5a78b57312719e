"""The ingestion pipeline end to end on the embedded queue, per provider
(docs/design.md "Unit of work", "Failed imports", "Transient failures")."""

from __future__ import annotations

import asyncio
import calendar
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_error_imports,
    failed_message_group_hours,
    failed_messages,
)
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.pipeline import IngestionService, IngestionUnitOfWork
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.exceptions import BodyStoreError
from controlroom.transport.base import Transport
from controlroom.transport.embedded import EmbeddedQueue
from tests.factories import at
from tests.nsb import failed_headers
from tests.tcp_proxy import TcpProxy

TIMEOUT = 60


def count(engine: sa.Engine, table: sa.Table, *where: sa.ColumnElement[bool]) -> int:
    with engine.connect() as conn:
        query = sa.select(sa.func.count()).select_from(table)
        return conn.execute(query.where(*where)).scalar_one()


async def ingest_until(
    settings: Settings,
    engine: sa.Engine,
    transport: Transport,
    done: Callable[[], bool],
    *,
    body_store: FileSystemBodyStore | None = None,
) -> None:
    """Run the ingestion service until ``done()`` holds (checked off the loop), then stop."""
    service = IngestionService(
        settings, engine, transport, body_store or FileSystemBodyStore(settings.body_dir)
    )
    await run_until(service, done)


async def run_until(service: Any, done: Callable[[], bool]) -> None:
    """Run ``service`` (an intake with ``run`` and ``stop``) until ``done()`` holds
    (checked off the loop), then stop it; fails if the service ends first."""
    task = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(TIMEOUT):
            while not await asyncio.to_thread(done):
                assert not task.done(), task.exception()
                await asyncio.sleep(0.05)
    finally:
        await service.stop()


async def publish_all(transport: Transport, queue: str, messages: list) -> None:
    for headers, body in messages:
        await transport.publish(queue, headers, body)


def ingest_from_the_embedded_queue(
    settings: Settings, engine: sa.Engine, messages: list[tuple[dict[str, Any], bytes]]
) -> None:
    """Publish ``messages`` (headers, body) to the embedded error queue and ingest until
    each is a stored failed message."""

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await publish_all(transport, settings.error_queue, messages)
            await ingest_until(
                settings, engine, transport, lambda: count(engine, failed_messages) == len(messages)
            )

    asyncio.run(scenario())


def test_queue_to_rows_with_folding_failed_import_and_two_subscribers(
    settings: Settings, engine: sa.Engine
) -> None:
    messages = [
        (failed_headers("order-1", failed_at=at(s)), f'{{"attempt": {s}}}'.encode())
        for s in (3, 1, 2)
    ]
    messages += [
        (failed_headers("event-9", endpoint=name), b"{}") for name in ("Billing", "Shipping")
    ]
    broken = {k: v for k, v in failed_headers("broken").items() if k != "NServiceBus.FailedQ"}
    messages.append((broken, b"kept whole \x00\xff"))

    async def scenario() -> int:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await publish_all(transport, settings.error_queue, messages)
            await ingest_until(
                settings,
                engine,
                transport,
                lambda: (
                    count(engine, failed_messages) == 3 and count(engine, failed_error_imports) == 1
                ),
            )
            return await transport.purge(settings.error_queue)

    left_in_queue = asyncio.run(scenario())

    assert left_in_queue == 0  # every message acknowledged after its commit
    with engine.connect() as conn:
        rows = {
            r.message_id + "@" + r.receiving_endpoint: r
            for r in conn.execute(sa.select(failed_messages))
        }
        failed_import = conn.execute(sa.select(failed_error_imports)).one()
    order = rows["order-1@Sales"]
    assert order.number_of_processing_attempts == 3
    assert (order.first_failure_at, order.last_failure_at) == (at(1), at(3))
    assert order.body_text == '{"attempt": 3}'
    assert {"event-9@Billing", "event-9@Shipping"} <= rows.keys()
    assert "NServiceBus.FailedQ" in failed_import.reason
    assert failed_import.body == b"kept whole \x00\xff"


def test_a_failure_in_the_last_instant_of_year_9999_is_stored_and_counts_in_its_hour(
    settings: Settings, engine: sa.Engine
) -> None:
    """Breaker pass: on SQLite ``9999-12-31 23:59:59:999999 Z`` gave no hour (SQLite's
    ``strftime`` rounds to the millisecond, past its last year), so the group-hours
    trigger failed its batch for ever, the other messages of the batch with it; and a
    failure far ahead dropped its group's present hours as older than 48 of its own."""
    last = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    now = datetime.now(UTC).replace(microsecond=0)
    messages = [
        (failed_headers("now", failed_at=now), b"{}"),
        (failed_headers("last", failed_at=last), b"{}"),
    ]

    ingest_from_the_embedded_queue(settings, engine, messages)

    with engine.connect() as conn:
        stored = conn.execute(
            sa.select(failed_messages.c.last_failure_at).where(
                failed_messages.c.message_id == "last"
            )
        ).scalar_one()
        hours = dict(
            conn.execute(
                sa.select(
                    failed_message_group_hours.c.hour, sa.func.sum(failed_message_group_hours.c.n)
                ).group_by(failed_message_group_hours.c.hour)
            ).all()
        )
    assert stored == last
    now_hour = calendar.timegm(now.utctimetuple()) // 3600  # whole seconds, no float
    last_hour = calendar.timegm(last.utctimetuple()) // 3600
    assert hours[now_hour] > 0 and hours[last_hour] > 0, hours


def test_huge_exception_message_and_stack_trace_are_ingested_and_classified(
    settings: Settings, engine: sa.Engine
) -> None:
    xml = "<order>" + "<line sku='A-1' qty='2'>text &amp; more</line>" * 20_000 + "</order>"
    frames = "\n".join(f"   at Shop.Deep.Frame{i}.Call(Int32 depth)" for i in range(10_000))
    messages = [
        (failed_headers("big-message", exception_message=xml), b"{}"),
        (
            failed_headers("deep-trace", stack_trace="System.StackOverflowException: x\n" + frames),
            b"{}",
        ),
    ]

    ingest_from_the_embedded_queue(settings, engine, messages)

    with engine.connect() as conn:
        row = conn.execute(
            sa.select(failed_messages).where(failed_messages.c.message_id == "big-message")
        ).one()
    assert row.exception_message == xml  # stored whole, not truncated


def test_failed_external_body_write_commits_nothing(settings: Settings, engine: sa.Engine) -> None:
    class BrokenBodyStore(FileSystemBodyStore):
        def put(self, key: str, data: bytes) -> None:
            raise BodyStoreError("disk full")

    attempt = parse_failed_message(
        failed_headers("large", content_type="application/octet-stream"),
        b"\x89PNG" * 10,
        max_body_size_to_store=settings.max_body_size_to_store,
    )
    unit = IngestionUnitOfWork(FailedMessageBatchWriter(engine), BrokenBodyStore(settings.body_dir))

    async def scenario() -> None:
        unit.record_failed_processing_attempt(attempt)
        for endpoint in attempt.endpoints:
            unit.record_known_endpoint(endpoint)
        await unit.complete()

    with pytest.raises(BodyStoreError):
        asyncio.run(scenario())
    assert count(engine, failed_messages) == 0


def test_database_lost_mid_run_acknowledges_nothing_uncommitted_and_resumes(
    postgresql_url: str, tmp_path: Path
) -> None:
    upgrade_database(create_store_engine(postgresql_url))
    url = sa.make_url(postgresql_url)
    with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        engine = create_store_engine(url.set(port=proxy.port).render_as_string(hide_password=False))
        settings = Settings(
            data_dir=tmp_path / "data",
            database_url=postgresql_url,
            ingestion={"batch_size": 10, "max_backoff_seconds": 0.2},
        )
        first = [(failed_headers(f"before-{n}"), b"{}") for n in range(5)]
        second = [(failed_headers(f"during-{n}"), b"{}") for n in range(25)]

        async def scenario() -> None:
            async with EmbeddedQueue(settings.embedded_queue_path) as transport:
                service = IngestionService(
                    settings, engine, transport, FileSystemBodyStore(settings.body_dir)
                )
                task = asyncio.create_task(service.run())
                try:
                    async with asyncio.timeout(TIMEOUT):
                        await publish_all(transport, settings.error_queue, first)
                        while count(engine, failed_messages) < 5:
                            await asyncio.sleep(0.05)
                        proxy.cut()
                        await publish_all(transport, settings.error_queue, second)
                        await asyncio.sleep(2)  # the writer keeps failing and backing off
                        # Nothing of the second wave is acknowledged: the queue has it all.
                        assert await queued_including_in_flight(settings) == 25
                        proxy.restore()
                        while count(engine, failed_messages) < 30:
                            await asyncio.sleep(0.05)
                finally:
                    proxy.restore()
                    await service.stop()  # also ends a writer stuck retrying
                assert task.cancelled()  # stopped, not crashed
                assert await transport.purge(settings.error_queue) == 0

        asyncio.run(scenario())
        engine.dispose()


async def queued_including_in_flight(settings: Settings) -> int:
    """Messages still in the embedded queue file, leased or not (read by a second handle)."""
    import sqlite3

    def read() -> int:
        with sqlite3.connect(settings.embedded_queue_path) as conn:
            return conn.execute("SELECT count(*) FROM queue_messages").fetchone()[0]

    return await asyncio.to_thread(read)


def test_retry_confirmation_resolves_the_failed_message(
    settings: Settings, engine: sa.Engine
) -> None:
    attempt = parse_failed_message(failed_headers("order-7"), b"{}", max_body_size_to_store=10)
    confirmation = {
        "ServiceControl.Retry.Successful": "2026-01-01 00:00:10:000000 Z",
        "ServiceControl.Retry.UniqueMessageId": attempt.unique_message_id,
        "NServiceBus.MessageId": str(uuid.uuid4()),
        "NServiceBus.ControlMessage": "True",
    }

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await publish_all(transport, settings.error_queue, [(failed_headers("order-7"), b"{}")])
            await publish_all(transport, settings.error_queue, [(confirmation, b"")])
            resolved = failed_messages.c.status == int(FailedMessageStatus.RESOLVED)
            await ingest_until(
                settings, engine, transport, lambda: count(engine, failed_messages, resolved) == 1
            )

    asyncio.run(scenario())
