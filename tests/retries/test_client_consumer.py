"""The consumer side of ``controlroom.client`` (docs/decisions.md "The demo closes the retry
loop"): an endpoint that takes a
retried message and fails it again moves it to the error queue with
``move_to_error_queue``, as NServiceBus's recoverability does; ingestion makes it a new
attempt of the same failed message. Every provider, on the embedded queue."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlroom.client import move_to_error_queue
from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.retries import requests as retries
from controlroom.transport.embedded import EmbeddedQueue
from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import TIMEOUT, make_processor, statuses, store_failed, take, wait_for
from tests.transport.helpers import Collector

EDIT_ID = "6f1c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f"
LATER = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC)


class OutOfStockError(Exception):
    pass


def raise_out_of_stock() -> None:
    raise OutOfStockError("SKU 'CAFE-CUP-02' has 0 left, 3 requested")


def test_a_retried_message_moved_to_the_error_queue_is_a_new_attempt_of_the_same_row(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    # An edited copy's failure: its id is its ServiceControl.Retry.UniqueMessageId, not the
    # one its message id and endpoint give, so only the kept retry header finds its row.
    headers = failed_headers("order-1", endpoint="Warehouse", failed_at=at(0))
    headers[h.RETRY_UNIQUE_MESSAGE_ID] = EDIT_ID
    failed = store_failed(settings, writer, body_store, headers, b'{"Sku": "CAFE-CUP-02"}')
    assert failed.unique_message_id == EDIT_ID
    retries.retry_message(engine, failed.unique_message_id)

    async def scenario() -> dict[str, str | None]:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            processor = make_processor(settings, engine, transport, body_store)
            assert await processor.process_pending() == 1
            await processor.close()
            async with Collector(transport, "Warehouse", prefetch=1) as endpoint:
                (delivery,) = await take(endpoint, 1)
            try:
                raise_out_of_stock()
            except OutOfStockError as exc:
                moved = await move_to_error_queue(
                    transport,
                    delivery.headers,
                    delivery.body,
                    exc,
                    failed_queue="Warehouse",
                    error_queue=settings.error_queue,
                    time_of_failure=LATER,
                )
            ingestion = IngestionService(settings, engine, transport, body_store)
            ingesting = asyncio.create_task(ingestion.run())
            try:
                await wait_for(
                    lambda: (
                        statuses(engine)[failed.unique_message_id] is FailedMessageStatus.UNRESOLVED
                    )
                )
            finally:
                await ingestion.stop()
                await asyncio.gather(ingesting, return_exceptions=True)
            return moved

    moved = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT))

    assert moved[h.FAILED_Q] == "Warehouse"
    assert moved[h.TIME_OF_FAILURE] == "2026-12-01 09:30:15:123456 Z"
    assert moved[h.EXCEPTION_TYPE] == f"{__name__}.OutOfStockError"
    assert moved[h.EXCEPTION_MESSAGE] == "SKU 'CAFE-CUP-02' has 0 left, 3 requested"
    assert moved[h.EXCEPTION_SOURCE] == __name__
    assert "in raise_out_of_stock" in (moved[h.EXCEPTION_STACK_TRACE] or "")
    assert moved[h.PROCESSING_ENDPOINT] == "Warehouse"
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(failed_messages).where(failed_messages.c.id == failed.unique_message_id)
        ).one()
    assert row.number_of_processing_attempts == 2
    assert row.exception_type == f"{__name__}.OutOfStockError"
    assert row.last_failure_at.replace(tzinfo=UTC) == LATER


def readme_endpoint() -> str:
    """The Python program of README.md's "The consumer side" section."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("### The consumer side", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_endpoint_confirms_what_it_processed_and_moves_what_failed(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The README's example, run as written (only its ``handle`` replaced by one that
    fails one order): the processed retry ends Resolved, the failed one Unresolved with
    one more attempt."""
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", settings.effective_database_url)
    for name in ("CONTROLROOM_CONFIG", "CONTROLROOM_BROKER_URL", "CONTROLROOM_ERROR_QUEUE"):
        monkeypatch.delenv(name, raising=False)
    good, bad = (
        store_failed(settings, writer, body_store, failed_headers(f"order-{n}"), body)
        for n, body in enumerate([b'{"OrderId": 1}', b'{"OrderId": 2}'])
    )
    retries.retry_all(engine)
    program: dict[str, object] = {"__name__": "readme_endpoint"}
    exec(compile(readme_endpoint(), "README.md", "exec"), program)

    def handle(body: bytes) -> None:
        if json.loads(body)["OrderId"] == 2:
            raise ValueError("order 2 cannot be placed")

    program["handle"] = handle

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            processor = make_processor(settings, engine, transport, body_store)
            assert await processor.process_pending() == 1
            await processor.close()
            ingestion = IngestionService(settings, engine, transport, body_store)
            run_endpoint = program["run_endpoint"]
            assert callable(run_endpoint)
            tasks = [
                asyncio.create_task(ingestion.run()),
                asyncio.create_task(run_endpoint("Sales")),
            ]
            try:
                await wait_for(
                    lambda: FailedMessageStatus.RETRY_ISSUED not in statuses(engine).values()
                )
                assert not tasks[1].done(), tasks[1].exception()
            finally:
                await ingestion.stop()
                tasks[1].cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT))

    assert statuses(engine) == {
        good.unique_message_id: FailedMessageStatus.RESOLVED,
        bad.unique_message_id: FailedMessageStatus.UNRESOLVED,
    }
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(failed_messages).where(failed_messages.c.id == bad.unique_message_id)
        ).one()
    assert row.number_of_processing_attempts == 2
    assert (row.exception_type, row.exception_message) == ("ValueError", "order 2 cannot be placed")


def test_an_exception_whose_text_is_not_utf8_is_moved_with_its_bytes_escaped(
    settings: Settings,
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
) -> None:
    # Python decodes bytes that are not UTF-8 (a file name, an environment variable) to
    # lone surrogates; an exception naming them must still reach the error queue, not
    # raise ValueError in the consumer's failure path (the message would never move).
    name = b"report-\xff.csv".decode("utf-8", "surrogateescape")
    headers = failed_headers("order-2", endpoint="Warehouse", failed_at=at(0))

    async def scenario() -> dict[str, str | None]:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            try:
                raise OutOfStockError(f"cannot read {name}")
            except OutOfStockError as exc:
                moved = await move_to_error_queue(
                    transport,
                    headers,
                    b"{}",
                    exc,
                    failed_queue="Warehouse",
                    error_queue=settings.error_queue,
                    time_of_failure=LATER,
                )
            ingestion = IngestionService(settings, engine, transport, body_store)
            ingesting = asyncio.create_task(ingestion.run())
            try:
                await wait_for(lambda: bool(statuses(engine)))
            finally:
                await ingestion.stop()
                await asyncio.gather(ingesting, return_exceptions=True)
            return moved

    moved = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT))

    assert moved[h.EXCEPTION_MESSAGE] == "cannot read report-\\udcff.csv"
    assert "cannot read report-\\udcff.csv" in (moved[h.EXCEPTION_STACK_TRACE] or "")
    with engine.connect() as conn:
        row = conn.execute(sa.select(failed_messages)).one()
    assert row.exception_message == "cannot read report-\\udcff.csv"
