"""A whole telemetry write is bounded by ``audit.request_budget`` on every provider: the
HTTP intake answers 503 with Retry-After naming the packets it did not write, and the
queue intake acknowledges what it wrote and gives back the rest.

The budget is measured on a clock that moves only when a transaction commits (each
commit: ``STEP`` seconds), so a request of three chunks of 50 ids writes exactly two
within a budget of ``BUDGET`` seconds, whatever the machine's speed."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import AuditSettings, IngestionSettings, Settings
from controlroom.db.tables import site_calls
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.sitecalls import intake
from controlroom.sitecalls.intake import TelemetryIngestionService, make_writer
from controlroom.sitecalls.writer import IngestBudgetExceeded
from controlroom.transport import EmbeddedQueue
from tests.integration.test_ingestion import TIMEOUT, count
from tests.sitecalls.packets import packet, received

BUDGET = 10.0
STEP = 6.0  # two commits fit in the budget, a third chunk does not start
CHUNK = 50


class CommitClock:
    """A monotonic clock that moves ``STEP`` seconds at each commit on ``engine``."""

    def __init__(self, engine: sa.Engine) -> None:
        self.now = 0.0
        self._engine = engine
        sa.event.listen(engine, "commit", self._tick)

    def _tick(self, _conn: sa.Connection) -> None:
        self.now += STEP

    def __call__(self) -> float:
        return self.now

    def close(self) -> None:
        sa.event.remove(self._engine, "commit", self._tick)


@pytest.fixture
def clock(engine: sa.Engine) -> Iterator[CommitClock]:
    ticking = CommitClock(engine)
    try:
        yield ticking
    finally:
        ticking.close()


def budgeted(settings: Settings, **changes: Any) -> Settings:
    return settings.model_copy(update={"audit": AuditSettings(request_budget=BUDGET), **changes})


def three_chunks() -> list[dict[str, Any]]:
    """150 packets of distinct ids: three chunks of 50 (ids sorted)."""
    ids = sorted(str(uuid.uuid4()) for _ in range(3 * CHUNK))
    return [packet("Submitted", op_id=op_id) for op_id in ids]


def stored_ids(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.select(site_calls.c.tracked_operation_id)).scalars())


def test_the_writer_stops_at_the_request_budget_and_says_what_it_left(
    settings: Settings, engine: sa.Engine, clock: CommitClock
) -> None:
    packets = three_chunks()
    items = [received(p) for p in packets]
    items.insert(1, received({"not": "a packet"}))
    writer = make_writer(budgeted(settings), engine, monotonic=clock)
    with pytest.raises(IngestBudgetExceeded) as stopped:
        writer.write(items)
    left = stopped.value.unwritten
    assert left == list(range(2 * CHUNK + 1, 3 * CHUNK + 1))  # the third chunk's packets
    assert stopped.value.reasons[1] is not None  # the contract's rejection is kept
    written = {p["tracked_operation_id"] for p in packets[: 2 * CHUNK]}
    assert stored_ids(engine) == written


def test_a_request_past_its_budget_answers_503_naming_what_to_send_again(
    settings: Settings,
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
    clock: CommitClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        "controlroom.api.sitecalls.make_writer", functools.partial(make_writer, monotonic=clock)
    )
    packets = three_chunks()
    packets.insert(0, {"tracked_operation_id": "not a guid"})
    with TestClient(create_app(budgeted(settings), engine, body_store)) as client:
        answer = client.post("/api/site-calls/telemetry", json=packets)
        assert answer.status_code == 503, answer.text
        assert answer.headers["Retry-After"] == "1"
        body = answer.json()
        assert body["accepted"] == list(range(1, 2 * CHUNK + 1))
        assert [item["index"] for item in body["rejected"]] == [0]
        assert body["unwritten"] == list(range(2 * CHUNK + 1, 3 * CHUNK + 1))
        assert "request's budget" in body["detail"]
        assert stored_ids(engine) == {packets[i]["tracked_operation_id"] for i in body["accepted"]}

        again = client.post(
            "/api/site-calls/telemetry", json=[packets[i] for i in body["unwritten"]]
        )
        assert again.status_code == 200, again.text
        assert len(stored_ids(engine)) == 3 * CHUNK


def test_the_queue_intake_gives_back_what_a_batch_could_not_write(
    settings: Settings,
    engine: sa.Engine,
    clock: CommitClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(intake, "make_writer", functools.partial(make_writer, monotonic=clock))
    settings = budgeted(
        settings,
        # The first batch waits for all three chunks (published before the intake starts):
        # on a busy machine the queue may hand them over in parts.
        ingestion=IngestionSettings(
            batch_size=3 * CHUNK, linger_seconds=2.0, max_backoff_seconds=0.05
        ),
    )
    packets = three_chunks()

    async def scenario() -> int:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            for item in packets:
                await transport.publish(settings.telemetry_queue, {}, json.dumps(item).encode())
            service = TelemetryIngestionService(settings, engine, transport)
            task = asyncio.create_task(service.run())
            try:
                async with asyncio.timeout(TIMEOUT):
                    while await asyncio.to_thread(count, engine, site_calls) < len(packets):
                        assert not task.done(), task.exception()
                        await asyncio.sleep(0.05)
            finally:
                await service.stop()
            return await transport.purge(settings.telemetry_queue)

    with caplog.at_level(logging.WARNING, logger="controlroom.sitecalls.intake"):
        left_in_queue = asyncio.run(scenario())
    assert left_in_queue == 0
    assert stored_ids(engine) == {p["tracked_operation_id"] for p in packets}
    given_back = [
        r.getMessage() for r in caplog.records if "returned to the queue" in r.getMessage()
    ]
    assert given_back, "no batch was cut at its budget"


def test_a_batch_that_writes_nothing_within_its_budget_degrades_the_intake(
    settings: Settings, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaker pass (second): a budget no chunk could meet gave every batch back for ever
    while health said ok (the packets held by the intake are not waiting in the queue,
    and a stall is counted from there). A batch given back whole now fails the intake's
    health, as any other failed write does; one that wrote a part is progress."""
    leaps = itertools.count(step=1_000.0)  # every look at the clock is past the budget
    monkeypatch.setattr(
        intake, "make_writer", functools.partial(make_writer, monotonic=lambda: next(leaps))
    )
    settings = budgeted(settings, ingestion=IngestionSettings(max_backoff_seconds=0.05))

    async def scenario() -> bool:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            for item in three_chunks():
                await transport.publish(settings.telemetry_queue, {}, json.dumps(item).encode())
            service = TelemetryIngestionService(settings, engine, transport)
            task = asyncio.create_task(service.run())
            try:
                async with asyncio.timeout(TIMEOUT):
                    while not service.health.state().degraded:
                        assert not task.done(), task.exception()
                        await asyncio.sleep(0.05)
            finally:
                await service.stop()
            return service.health.state().degraded

    assert asyncio.run(scenario())
    assert stored_ids(engine) == set()
