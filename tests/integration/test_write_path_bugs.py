"""A programming error in the write path is not bad data (docs/design.md "Failed imports": only
a reason of the message's own makes a failed import). A bug raising ``ValueError`` inside
the writer's transaction gives the batch back, unacknowledged, and is logged as an error
with its traceback; it never turns the batch's messages into failed imports or rejected
packets. What the driver refuses (text it cannot encode) still is the input's fault. Per
provider, on the embedded queue."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import failed_error_imports, failed_messages, rejected_telemetry
from controlroom.errors.ingest import writer as ingest_writer
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.sitecalls import writer as sitecall_writer
from controlroom.sitecalls.intake import TelemetryIngestionService
from controlroom.sitecalls.writer import ReceivedPacket, SiteCallWriter
from controlroom.transport.embedded import EmbeddedQueue
from tests.integration.test_ingestion import count, publish_all, run_until
from tests.nsb import failed_headers
from tests.sitecalls import packets as factory

BUG = "zip() argument 2 is shorter than argument 1"  # what a strict zip of a bug raises


def new_id() -> str:
    return str(uuid.uuid4())


def quick_backoff(settings: Settings) -> Settings:
    ingestion = settings.ingestion.model_copy(update={"max_backoff_seconds": 0.01})
    return settings.model_copy(update={"ingestion": ingestion})


def given_back(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    """The ERROR records of ``logger`` saying a batch went back to the queue."""
    return [
        r
        for r in caplog.records
        if r.name == logger and r.levelno == logging.ERROR and "returned to the queue" in r.msg
    ]


def assert_logged_as_a_bug(records: list[logging.LogRecord]) -> None:
    assert records, "the batch was never given back"
    exc_info = records[0].exc_info
    assert exc_info is not None and isinstance(exc_info[1], ValueError)
    assert str(exc_info[1]) == BUG


def test_a_writer_bug_gives_the_ingestion_batch_back_and_keeps_no_failed_import(
    settings: Settings,
    engine: sa.Engine,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken_row(*args: object) -> dict[str, Any]:
        raise ValueError(BUG)

    # Inside the writer's transaction, on the failed messages' path only (a failed
    # import's write does not pass here), as a real bug in the writer would be.
    monkeypatch.setattr(ingest_writer, "failed_message_row", broken_row)
    settings = quick_backoff(settings)
    logger = "controlroom.errors.ingest.pipeline"
    messages = [(failed_headers(f"bug-{n}"), b"{}") for n in range(2)]

    def settled() -> bool:
        return len(given_back(caplog, logger)) >= 2 or count(engine, failed_error_imports) > 0

    async def scenario() -> int:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await publish_all(transport, settings.error_queue, messages)
            bodies = FileSystemBodyStore(settings.body_dir)
            await run_until(IngestionService(settings, engine, transport, bodies), settled)
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            return await transport.purge(settings.error_queue)

    with caplog.at_level(logging.ERROR, logger=logger):
        left_in_queue = asyncio.run(scenario())
    assert count(engine, failed_error_imports) == 0
    assert count(engine, failed_messages) == 0
    assert left_in_queue == len(messages)
    assert_logged_as_a_bug(given_back(caplog, logger))


def test_a_writer_bug_gives_the_telemetry_batch_back_and_rejects_no_packet(
    settings: Settings,
    engine: sa.Engine,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken_upsert(*args: object) -> None:
        raise ValueError(BUG)

    monkeypatch.setattr(sitecall_writer, "upsert_site_calls", broken_upsert)
    settings = quick_backoff(settings)
    logger = "controlroom.sitecalls.intake"
    bodies = [json.dumps(factory.packet("Submitted", op_id=new_id())).encode() for _ in range(2)]

    def settled() -> bool:
        return len(given_back(caplog, logger)) >= 2 or count(engine, rejected_telemetry) > 0

    async def scenario() -> int:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            for body in bodies:
                await transport.publish(settings.telemetry_queue, {}, body)
            await run_until(TelemetryIngestionService(settings, engine, transport), settled)
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            return await transport.purge(settings.telemetry_queue)

    with caplog.at_level(logging.ERROR, logger=logger):
        left_in_queue = asyncio.run(scenario())
    assert count(engine, rejected_telemetry) == 0
    assert left_in_queue == len(bodies)
    assert_logged_as_a_bug(given_back(caplog, logger))


def test_text_the_driver_cannot_encode_is_still_the_packets_fault(engine: sa.Engine) -> None:
    # Past the contract (which refuses unpaired surrogates): the driver refuses to encode
    # the text, which is the packet's fault, so the per-row fallback keeps it rejected.
    good = factory.validated(factory.packet("Submitted", op_id=new_id()))
    forged = good.model_construct(**{**dict(good), "target": "t\ud800"})
    fine = factory.received(factory.packet("Submitted", op_id=new_id()))
    items = [ReceivedPacket(raw=b'{"forged": true}', source="test", packet=forged), fine]
    reasons = SiteCallWriter(engine).write(items)
    assert reasons[0] == (
        "target: must be valid Unicode text (an unpaired surrogate) (the store refused the packet)"
    )
    assert reasons[1] is None
    assert count(engine, rejected_telemetry) == 1
