"""docs/decisions.md "A stop finishes the batches in hand": an intake told to stop takes no
more deliveries, but a batch it holds keeps retrying a transient store failure for
``ingestion.stop_grace_seconds``; a store still refusing when the grace ends gets the
batch back in the queue. Both intakes (the error queue's, the site-call telemetry
queue's), per provider, on the embedded queue, with the store's writes held by another
connection and every lock wait of the intake's own connections short (a transient
failure within a fraction of a second, as a busy store gives)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import failed_messages, site_calls
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.sitecalls.intake import TelemetryIngestionService
from controlroom.transport.embedded import EmbeddedQueue
from tests.integration.test_ingestion import count, publish_all
from tests.nsb import failed_headers
from tests.refusing import writes_held
from tests.sitecalls.packets import packet

TIMEOUT = 60  # seconds, per test
BATCH = 10
LOCK_WAIT_MS = 200


def short_lock_waits(engine: sa.Engine) -> None:
    """Every new connection of ``engine`` waits at most ``LOCK_WAIT_MS`` for a lock, then
    fails transiently (SQLite "database is locked", PostgreSQL lock_not_available)."""

    def limit(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        if engine.dialect.name == "sqlite":
            cursor.execute(f"PRAGMA busy_timeout = {LOCK_WAIT_MS}")
        else:
            cursor.execute(f"SET SESSION lock_timeout = {LOCK_WAIT_MS}")
            dbapi_connection.commit()
        cursor.close()

    engine.dispose()
    sa.event.listen(engine, "connect", limit)


Service = IngestionService | TelemetryIngestionService


@dataclass(frozen=True)
class Intake:
    """One intake as the test drives it: how it is made, its queue, what a batch of it
    holds and the table it writes."""

    make: Callable[[Settings, sa.Engine, EmbeddedQueue], Service]
    queue: Callable[[Settings], str]
    messages: Callable[[], list[tuple[dict[str, str | None], bytes]]]
    table: sa.Table


def _failed_messages() -> list[tuple[dict[str, str | None], bytes]]:
    return [(failed_headers(f"held-{n}"), b"{}") for n in range(BATCH)]


def _telemetry() -> list[tuple[dict[str, str | None], bytes]]:
    packets = [packet("Submitted", op_id=str(uuid.uuid4())) for _ in range(BATCH)]
    return [({}, json.dumps(data).encode()) for data in packets]


INTAKES = {
    "error queue": Intake(
        lambda settings, engine, transport: IngestionService(
            settings, engine, transport, FileSystemBodyStore(settings.body_dir)
        ),
        lambda settings: settings.error_queue,
        _failed_messages,
        failed_messages,
    ),
    "telemetry queue": Intake(
        TelemetryIngestionService,
        lambda settings: settings.telemetry_queue,
        _telemetry,
        site_calls,
    ),
}


@pytest.fixture(params=list(INTAKES))
def intake(request: pytest.FixtureRequest) -> Intake:
    return INTAKES[request.param]


def _with_grace(settings: Settings, grace: float) -> Settings:
    """Batches of ``BATCH``, quick back-offs, a grace of ``grace`` seconds."""
    ingestion = settings.ingestion.model_copy(
        update={
            "batch_size": BATCH,
            "linger_seconds": 1.0,  # one batch of BATCH, even on a busy machine
            "max_backoff_seconds": 0.1,
            "stop_grace_seconds": grace,
        }
    )
    return settings.model_copy(update={"ingestion": ingestion})


async def _stopped_while_held(
    intake: Intake,
    settings: Settings,
    engine: sa.Engine,
    *,
    grace: float,
    released_after: float | None,
) -> int:
    """Publish a batch, let its write fail while the store is held, stop the intake, and
    let the store go ``released_after`` seconds into the stop (never: ``None``). Returns
    what the queue still holds once the intake has stopped."""
    short_lock_waits(engine)
    settings = _with_grace(settings, grace)
    queue = intake.queue(settings)
    async with EmbeddedQueue(settings.embedded_queue_path) as transport:
        service = intake.make(settings, engine, transport)
        run = asyncio.create_task(service.run())
        async with asyncio.timeout(TIMEOUT):
            with writes_held(engine.url.render_as_string(hide_password=False), intake.table.name):
                await publish_all(transport, queue, intake.messages())
                # The batch is in hand and its write has failed: the intake says so.
                while service.health.state().write_failures == 0:
                    await asyncio.sleep(0.02)
                stop = asyncio.create_task(service.stop())
                if released_after is not None:
                    await asyncio.sleep(released_after)
                else:
                    await stop
            await stop
        assert run.done()
        return await transport.purge(queue)


def test_a_batch_in_hand_is_stored_once_the_store_lets_it_within_the_grace(
    intake: Intake, settings: Settings, engine: sa.Engine
) -> None:
    held = _stopped_while_held(intake, settings, engine, grace=30, released_after=1.0)
    left = asyncio.run(held)
    assert count(engine, intake.table) == BATCH
    assert left == 0


def test_a_batch_in_hand_goes_back_to_the_queue_when_the_grace_ends(
    intake: Intake, settings: Settings, engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    held = _stopped_while_held(intake, settings, engine, grace=0.5, released_after=None)
    left = asyncio.run(held)
    assert count(engine, intake.table) == 0
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    back = re.compile(r".*batch of (\d+) not written before the stop \(.+\); returned to the queue")
    # Under load the batcher may cut the messages into more than one batch.
    assert sum(int(m[1]) for line in said if (m := back.fullmatch(line))) == BATCH, said
    assert left == BATCH


def _waits_on_a_lock(database_url: str) -> bool:
    """Whether a session of the store's database waits on a lock (PostgreSQL)."""
    engine = create_store_engine(database_url)
    try:
        with engine.connect() as conn:
            return bool(
                conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_a_write_waiting_on_a_lock_without_bound_is_cancelled_when_the_grace_ends(
    intake: Intake, postgresql_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL waits on a lock for as long as it is held (``lock_timeout`` 0, as
    serve leaves it): the statement a batch in hand waits on is cancelled when the grace
    ends, so the stop ends within it and the batch goes back, while the lock is still
    held (before, the stop waited for the lock: a worker was killed past its margin, an
    intake in serve itself never ended). On SQLite every wait ends with the busy
    timeout."""
    engine = create_store_engine(postgresql_url)
    upgrade_database(engine)
    settings = _with_grace(
        Settings(data_dir=tmp_path / "data", database_url=postgresql_url), grace=0.5
    )
    queue = intake.queue(settings)

    async def stopped_while_locked() -> int:
        async with _running(intake, settings, engine) as (transport, service, run):
            with writes_held(postgresql_url, intake.table.name):
                await publish_all(transport, queue, intake.messages())
                while not await asyncio.to_thread(_waits_on_a_lock, postgresql_url):
                    await asyncio.sleep(0.05)
                await service.stop()  # ends while the lock is held
                assert run.done()
            return await transport.purge(queue)

    try:
        left = asyncio.run(stopped_while_locked())
        assert count(engine, intake.table) == 0
    finally:
        engine.dispose()
    assert left == BATCH
    said = [r.getMessage() for r in caplog.records]
    sent = re.compile(r".*grace is over: sent a cancel to the 1 statement of .*")
    assert any(sent.fullmatch(m) for m in said), said


def test_what_an_intake_stored_since_its_last_report_is_said_at_its_stop(
    intake: Intake, settings: Settings, engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Fresh user (session 32): the log said nothing of what was stored after the last
    periodic line, so its lines never added up to what the store held (a 7 s drain then
    a stop: no line at all). The stop says it, from the counts alone (no query)."""
    caplog.set_level(logging.INFO)
    ingestion = settings.ingestion.model_copy(
        update={"batch_size": BATCH, "linger_seconds": 0.1, "report_interval_seconds": 3600}
    )
    settings = settings.model_copy(update={"ingestion": ingestion})
    queue = intake.queue(settings)

    async def drained_then_stopped() -> None:
        async with _running(intake, settings, engine) as (transport, service, run):
            await publish_all(transport, queue, intake.messages())
            while await asyncio.to_thread(count, engine, intake.table) < BATCH:
                assert not run.done()
                await asyncio.sleep(0.05)
            await service.stop()

    asyncio.run(drained_then_stopped())
    stopped = re.compile(
        rf"(ingested|stored) {BATCH} .* from {re.escape(queue)} in the last \d+ s, before the stop"
    )
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if stopped.match(m)], said


@contextlib.asynccontextmanager
async def _running(
    intake: Intake, settings: Settings, engine: sa.Engine
) -> AsyncIterator[tuple[EmbeddedQueue, Service, asyncio.Task[None]]]:
    """``intake`` running on an embedded queue of its own: the queue, the service and
    its run, for at most ``TIMEOUT``."""
    async with EmbeddedQueue(settings.embedded_queue_path) as transport:
        service = intake.make(settings, engine, transport)
        run = asyncio.create_task(service.run())
        async with asyncio.timeout(TIMEOUT):
            yield transport, service, run
