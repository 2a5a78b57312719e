"""The telemetry queue, on the embedded queue and on RabbitMQ, per provider: packets
become rows, a bad packet is kept whole in rejected_telemetry, every delivery is
acknowledged after the commit (docs/decisions.md "Telemetry intake keeps what it refuses")."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import audit_log, event_log_items, rejected_telemetry, site_calls
from controlroom.runtime.intake_health import IntakeHealth
from controlroom.sitecalls.demo import generate_demo_telemetry
from controlroom.sitecalls.intake import INTAKE_NAME, TelemetryIngestionService
from controlroom.transport import EmbeddedQueue, RabbitMQTransport, Transport
from tests.integration.test_ingestion import count, run_until
from tests.sitecalls import packets as factory

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


async def ingest_until(
    settings: Settings, engine: sa.Engine, transport: Transport, done: Callable[[], bool]
) -> None:
    service = TelemetryIngestionService(settings, engine, transport)
    await run_until(service, done)


def demo_bodies() -> tuple[list[bytes], int, int]:
    """The demo's packets (with their duplicates and swaps), one broken body; the
    number of distinct calls and of distinct audit events."""
    packets = generate_demo_telemetry(12, seed=7, now=NOW)
    calls = len({p["tracked_operation_id"] for p in packets})
    events = len({p["audit_event"]["event_id"] for p in packets if "audit_event" in p})
    bodies = [json.dumps(p).encode() for p in packets]
    bodies.insert(3, b'{"tracked_operation_id": "not a guid"}')
    return bodies, calls, events


async def run(settings: Settings, engine: sa.Engine, transport: Transport) -> int:
    bodies, calls, events = demo_bodies()
    for body in bodies:
        await transport.publish(settings.telemetry_queue, {}, body)
    await ingest_until(
        settings,
        engine,
        transport,
        lambda: (
            count(engine, rejected_telemetry) == 1
            and count(engine, site_calls) == calls
            and count(engine, audit_log) == events
        ),
    )
    return await transport.purge(settings.telemetry_queue)


def test_embedded_telemetry_queue_is_drained_and_acknowledged(
    settings: Settings, engine: sa.Engine
) -> None:
    async def scenario() -> int:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await run(settings, engine, transport)
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            return await transport.purge(settings.telemetry_queue)

    assert asyncio.run(scenario()) == 0
    with engine.connect() as conn:
        reason = conn.execute(sa.select(rejected_telemetry.c.reason)).scalar_one()
    assert reason.startswith("tracked_operation_id:")


def test_the_intake_says_what_it_stored_as_the_error_queues_does(
    settings: Settings, engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Fresh user's pass (session 31): 213 packets were stored, and no line of serve's log
    said so (the error queue's intake says what it stored every report)."""
    caplog.set_level(logging.INFO, logger="controlroom.sitecalls.intake")

    async def scenario() -> int:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            bodies, calls, _ = demo_bodies()
            for body in bodies:
                await transport.publish(settings.telemetry_queue, {}, body)
            service = TelemetryIngestionService(settings, engine, transport)
            await run_until(
                service,
                lambda: count(engine, rejected_telemetry) == 1
                and count(engine, site_calls) == calls,
            )
            # What the rounds during the run did not say, its stop says.
            return await transport.purge(settings.telemetry_queue)

    left = asyncio.run(scenario())
    said = re.compile(
        r"stored (\d+) telemetry packets \([\d.]+/s\), kept (\d+) in rejected_telemetry, "
        rf"from {settings.telemetry_queue} in the last \d+ s"
        rf"(?:; \d+ waiting in {settings.telemetry_queue}|, before the stop)"
    )
    found = [m for r in caplog.records if (m := said.fullmatch(r.getMessage()))]
    assert found, caplog.messages
    bodies, _, _ = demo_bodies()
    assert sum(int(m[1]) for m in found) == len(bodies) - 1 - left
    assert sum(int(m[2]) for m in found) == 1


@pytest.mark.rabbitmq
def test_rabbitmq_telemetry_queue_is_drained_and_acknowledged(
    settings: Settings, engine: sa.Engine, rabbitmq_url: str
) -> None:
    settings = settings.model_copy(
        update={"broker_url": rabbitmq_url, "telemetry_queue": f"telemetry-{uuid.uuid4().hex[:8]}"}
    )

    async def scenario() -> int:
        async with RabbitMQTransport(rabbitmq_url) as transport:
            await run(settings, engine, transport)
        # A fresh connection: anything not acknowledged is back in the queue by now.
        async with RabbitMQTransport(rabbitmq_url) as transport:
            return await transport.purge(settings.telemetry_queue)

    assert asyncio.run(scenario()) == 0


def test_the_demo_covers_every_scenario_with_valid_packets() -> None:
    from controlroom.telemetry.contract import validate_packet
    from controlroom.telemetry.ordering import fold_states

    packets = [validate_packet(p) for p in generate_demo_telemetry(8, seed=1, now=NOW)]
    by_call: dict[str, list] = {}
    for packet in packets:
        by_call.setdefault(packet.tracked_operation_id, []).append(packet)
    finals = sorted(fold_states(states).status.value for states in by_call.values())
    assert len(by_call) == 8
    assert {"Delivered", "Failed", "Parked", "Discarded", "Forwarded"} <= set(finals)
    assert any(p.epoch == 1 for p in packets)  # an operator retried a parked call
    assert {p.source_site for p in packets} <= {"plant-north", "plant-south", "depot-east"}
    assert all(p.updated_at_utc.instant <= NOW for p in packets)


def test_a_batch_the_store_cannot_take_goes_back_to_the_queue(
    settings: Settings, engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # The store fails for a reason that is neither the packet's nor transient (the table
    # is gone): nothing is acknowledged, the packet is still queued afterwards.
    settings = settings.model_copy(
        update={"ingestion": settings.ingestion.model_copy(update={"max_backoff_seconds": 0.01})}
    )
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE site_calls")
    body = json.dumps(generate_demo_telemetry(8, seed=1, now=NOW)[0]).encode()

    def returned() -> bool:
        return any("returned to the queue" in r.getMessage() for r in caplog.records)

    async def scenario() -> int:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await transport.publish(settings.telemetry_queue, {}, body)
            await ingest_until(settings, engine, transport, returned)
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            return await transport.purge(settings.telemetry_queue)

    with caplog.at_level("ERROR", logger="controlroom.sitecalls.intake"):
        assert asyncio.run(scenario()) == 1
    assert count(engine, rejected_telemetry) == 0


def poison_bodies() -> tuple[list[bytes], list[str]]:
    """Packets whose values no store holds, between good ones; the good ones' ids."""
    goods = [factory.packet("Attempted", op_id=str(uuid.uuid4()), at=NOW) for _ in range(4)]
    deep = factory.packet("Attempted", op_id=str(uuid.uuid4()), event_id=str(uuid.uuid4()))
    deep["audit_event"]["details_json"] = "[" * 5000
    poisons = [
        factory.packet(
            "Attempted", op_id=str(uuid.uuid4()), created_at_utc="0001-01-01T00:30:00+01:00"
        ),
        factory.packet(
            "Attempted", op_id=str(uuid.uuid4()), updated_at_utc="9999-12-31T23:59:59-01:00"
        ),
        deep,
    ]
    bodies = [json.dumps(p).encode() for p in goods[:2] + poisons + goods[2:]]
    return bodies, [g["tracked_operation_id"] for g in goods]


async def run_poison(settings: Settings, engine: sa.Engine, transport: Transport) -> None:
    bodies, goods = poison_bodies()
    for body in bodies:
        await transport.publish(settings.telemetry_queue, {}, body)
    await ingest_until(
        settings,
        engine,
        transport,
        lambda: count(engine, rejected_telemetry) == 3 and count(engine, site_calls) == len(goods),
    )


def assert_poison_kept_whole(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        reasons = sorted(conn.execute(sa.select(rejected_telemetry.c.reason)).scalars())
    assert [reason.split(":")[0] for reason in reasons] == [
        "audit_event.details_json",
        "created_at_utc",
        "updated_at_utc",
    ]


def test_out_of_range_packets_are_kept_and_the_embedded_queue_drains(
    settings: Settings, engine: sa.Engine
) -> None:
    async def scenario() -> int:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await run_poison(settings, engine, transport)
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            return await transport.purge(settings.telemetry_queue)

    assert asyncio.run(scenario()) == 0
    assert_poison_kept_whole(engine)


@pytest.mark.rabbitmq
def test_out_of_range_packets_are_kept_and_the_rabbitmq_queue_drains(
    settings: Settings, engine: sa.Engine, rabbitmq_url: str
) -> None:
    settings = settings.model_copy(
        update={"broker_url": rabbitmq_url, "telemetry_queue": f"telemetry-{uuid.uuid4().hex[:8]}"}
    )

    async def scenario() -> int:
        async with RabbitMQTransport(rabbitmq_url) as transport:
            await run_poison(settings, engine, transport)
        async with RabbitMQTransport(rabbitmq_url) as transport:
            return await transport.purge(settings.telemetry_queue)

    assert asyncio.run(scenario()) == 0
    assert_poison_kept_whole(engine)


def test_a_packet_that_breaks_validation_unexpectedly_is_kept_not_stranded(
    settings: Settings, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever escapes the contract for one packet (a bug of ours) is that packet's:
    # it is kept as rejected, its neighbours are written, every delivery acknowledged.
    from controlroom.sitecalls import intake

    real = intake.parse_packet

    def parse(body: bytes):  # type: ignore[no-untyped-def]
        if b"explode" in body:
            raise RuntimeError("a bug in validation")
        return real(body)

    monkeypatch.setattr(intake, "parse_packet", parse)
    good = factory.packet("Attempted", op_id=str(uuid.uuid4()), at=NOW)
    bad = factory.packet("Attempted", op_id=str(uuid.uuid4()), target="explode")

    async def scenario() -> int:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            for data in (bad, good):
                await transport.publish(settings.telemetry_queue, {}, json.dumps(data).encode())
            await ingest_until(
                settings,
                engine,
                transport,
                lambda: count(engine, rejected_telemetry) == 1 and count(engine, site_calls) == 1,
            )
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            return await transport.purge(settings.telemetry_queue)

    assert asyncio.run(scenario()) == 0
    with engine.connect() as conn:
        reason = conn.execute(sa.select(rejected_telemetry.c.reason)).scalar_one()
    assert "RuntimeError: a bug in validation" in reason


def test_the_intake_tells_its_listener_when_a_batch_stored_packets(
    settings: Settings, engine: sa.Engine
) -> None:
    """The KPI sampler's cue (``KpiSampler.intake_written``): told after a batch that
    stored packets, not after one whose every packet was rejected."""
    told: list[int] = []

    async def scenario(bodies: list[bytes], done: Callable[[], bool]) -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            for body in bodies:
                await transport.publish(settings.telemetry_queue, {}, body)
            service = TelemetryIngestionService(
                settings, engine, transport, on_written=lambda: told.append(1)
            )
            await run_until(service, done)

    asyncio.run(
        scenario(
            [b'{"tracked_operation_id": "not a guid"}'],
            lambda: count(engine, rejected_telemetry) == 1,
        )
    )
    assert told == []
    packets = generate_demo_telemetry(12, seed=7, now=NOW)
    asyncio.run(
        scenario([json.dumps(p).encode() for p in packets], lambda: count(engine, site_calls) > 0)
    )
    assert told != []


def intake_events(engine: sa.Engine, event_type: str) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(event_log_items).where(event_log_items.c.event_type == event_type)
            ).all()
        )


def quick(settings: Settings) -> Settings:
    ingestion = {"report_interval_seconds": 0.05, "max_backoff_seconds": 0.01}
    return settings.model_copy(
        update={"ingestion": settings.ingestion.model_copy(update=ingestion)}
    )


def test_a_telemetry_intake_with_work_and_nothing_stored_is_stalled_once_then_recovered(
    settings: Settings, engine: sa.Engine
) -> None:
    settings = quick(settings)
    bodies = [json.dumps(factory.packet("Attempted", op_id=str(uuid.uuid4()))).encode()]
    bodies += [json.dumps(factory.packet("Attempted", op_id=str(uuid.uuid4()))).encode()]
    path = f"/queue/{settings.telemetry_queue}"

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            for body in bodies:
                await transport.publish(settings.telemetry_queue, {}, body)
            service = TelemetryIngestionService(settings, engine, transport)
            clock = [0.0]
            service.health = IntakeHealth(
                INTAKE_NAME,
                settings.telemetry_queue,
                stall_seconds=60,
                monotonic=lambda: clock[0],
            )
            await service.report()  # two waiting, none stored: not stalled yet
            assert intake_events(engine, "IntakeStalled") == []
            clock[0] = 61.0
            await service.report()
            await service.report()  # still stalled: no second event
            (stalled,) = intake_events(engine, "IntakeStalled")
            assert "nothing stored for 61 s" in stalled.description
            assert json.loads(stalled.related_to_json) == [path]
            await run_until(
                service,
                lambda: (
                    count(engine, site_calls) == 2
                    and len(intake_events(engine, "IntakeRecovered")) == 1
                ),
            )

    asyncio.run(scenario())
    (recovered,) = intake_events(engine, "IntakeRecovered")
    assert json.loads(recovered.related_to_json) == [path]


def test_a_store_refusing_telemetry_writes_is_stalled_once_then_recovered(
    settings: Settings, engine: sa.Engine
) -> None:
    settings = quick(settings)
    body = json.dumps(factory.packet("Attempted", op_id=str(uuid.uuid4()))).encode()
    with engine.begin() as conn:  # the store refuses the writes (the table is gone)
        conn.exec_driver_sql("ALTER TABLE site_calls RENAME TO site_calls_away")

    restored: list[bool] = []

    def stalled_then_stored_again() -> bool:
        if not restored and intake_events(engine, "IntakeStalled"):
            with engine.begin() as conn:  # the store takes writes again
                conn.exec_driver_sql("ALTER TABLE site_calls_away RENAME TO site_calls")
            restored.append(True)
        return (
            bool(restored)
            and count(engine, site_calls) == 1
            and len(intake_events(engine, "IntakeRecovered")) == 1
        )

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await transport.publish(settings.telemetry_queue, {}, body)
            service = TelemetryIngestionService(settings, engine, transport)
            await run_until(service, stalled_then_stored_again)

    asyncio.run(scenario())
    (stalled,) = intake_events(engine, "IntakeStalled")
    assert "writes failing" in stalled.description
