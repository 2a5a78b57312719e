"""The retry processor on the embedded queue, every provider: the whole loop without a
broker, destinations, what it drops and why, the history it leaves, its lease."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
import sqlalchemy as sa

from controlroom.app import create_app
from controlroom.client import confirm_successful_retry
from controlroom.config import Settings
from controlroom.db.providers import provider_for
from controlroom.db.tables import (
    FailedMessageStatus,
    event_log_items,
    retry_batches,
    retry_operations,
)
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.grouping import EXCEPTION_TYPE_AND_STACK_TRACE
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.retries import requests as retries
from controlroom.errors.retries import wire as retry_wire
from controlroom.transport.embedded import EmbeddedQueue
from tests.nsb import failed_headers
from tests.retries.conftest import (
    TIMEOUT,
    batch_ids,
    batch_statuses,
    claims,
    make_processor,
    set_status,
    statuses,
    store_failed,
    store_many,
    take,
    wait_for,
)
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.transport.helpers import Collector


def test_embedded_queue_retry_round_trip_with_a_running_processor(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    headers = failed_headers("order-1", endpoint="Sales")
    headers["ServiceControl.RetryTo"] = "Sales.Retries@OTHER-HOST"
    attempt = store_failed(settings, writer, body_store, headers, b"<order id='1'/>")

    async def scenario() -> dict[str, str | None]:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            processor = make_processor(
                settings, engine, transport, body_store, poll_interval_seconds=30
            )
            running = asyncio.create_task(processor.run())
            app = create_app(settings, engine, body_store, retry_processor=processor)
            api = httpx.AsyncClient(
                transport=httpx.ASGITransport(app),
                base_url="http://test",
                timeout=TEST_CLIENT_TIMEOUT,
            )
            ingestion = IngestionService(settings, engine, transport, body_store)
            ingesting = asyncio.create_task(ingestion.run())
            try:
                async with api, asyncio.timeout(TIMEOUT):
                    await asyncio.sleep(0.2)  # the processor is idle, polling only every 30 s
                    response = await api.post(f"/api/errors/{attempt.unique_message_id}/retry")
                    assert response.status_code == 202
                    async with Collector(transport, "Sales.Retries", prefetch=5) as collector:
                        (delivery,) = await take(collector, 1)  # woken by the request
                    assert await confirm_successful_retry(transport, delivery.headers)
                    await wait_for(
                        lambda: (
                            statuses(engine)[attempt.unique_message_id]
                            == FailedMessageStatus.RESOLVED
                        )
                    )
                    return dict(delivery.headers)
            finally:
                await ingestion.stop()
                running.cancel()
                await asyncio.gather(running, ingesting, return_exceptions=True)

    sent = asyncio.run(scenario())

    # Sent to the RetryTo proxy, which reads the real destination from the header.
    assert sent["ServiceControl.TargetEndpointAddress"] == "Sales"
    assert sent["ServiceControl.RetryTo"] == "Sales.Retries@OTHER-HOST"  # kept: the original's
    assert "ServiceControl.Retry.Attempt.MessageId" not in sent
    assert claims(engine) == {}


def test_messages_that_changed_or_cannot_be_sent_are_dropped_and_reported(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    fine = store_failed(settings, writer, body_store, failed_headers("fine", endpoint="Q"))
    archived = store_failed(settings, writer, body_store, failed_headers("arch", endpoint="Q"))
    missing = store_failed(
        settings,
        writer,
        body_store,
        failed_headers("gone", endpoint="Q", content_type="application/octet-stream"),
        b"\x00binary",
    )
    request = retries.retry_all(engine)
    set_status(engine, archived.unique_message_id, FailedMessageStatus.ARCHIVED)  # meanwhile
    body_store.delete_message(missing.unique_message_id)  # the body store lost it

    async def scenario() -> list:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            processor = make_processor(settings, engine, transport, body_store)
            assert await processor.process_pending() == 1
            await processor.close()
            async with Collector(transport, "Q", prefetch=5) as collector:
                deliveries = await take(collector, 1)
                await collector.assert_idle(0.5)
            return deliveries

    (delivery,) = asyncio.run(scenario())

    assert delivery.headers[retry_wire.RETRY_UNIQUE_MESSAGE_ID] == fine.unique_message_id
    now = statuses(engine)
    assert now[archived.unique_message_id] == FailedMessageStatus.ARCHIVED  # left alone
    assert now[missing.unique_message_id] == FailedMessageStatus.UNRESOLVED  # can be seen again
    assert now[fine.unique_message_id] == FailedMessageStatus.RETRY_ISSUED  # until confirmed
    assert list(claims(engine)) == [fine.unique_message_id]
    with engine.connect() as conn:
        operation = conn.execute(
            sa.select(retry_operations).where(retry_operations.c.id == request.operation_id)
        ).one()
    # Breaker pass (third): the unsendable one was counted skipped, and the event said
    # "1 sent, 2 skipped", never that one could not be sent.
    assert (operation.message_count, operation.forwarded_count, operation.skipped_count) == (
        3,
        1,
        1,
    )
    assert operation.failed and operation.completed_at is not None
    with engine.connect() as conn:
        finished = conn.execute(
            sa.select(event_log_items.c.description).where(
                event_log_items.c.event_type == "RetryOperationCompleted"
            )
        ).scalar_one()
    assert finished.endswith("finished: 1 sent, 1 skipped, 1 could not be sent")
    assert batch_statuses(engine) == ["done"]


def test_history_lists_completed_operations_with_counts_and_outcome(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    attempts = [
        store_failed(settings, writer, body_store, failed_headers(f"h-{n}", endpoint="Q"))
        for n in range(3)
    ]
    (group,) = (g for g in attempts[0].groups if g.classifier == EXCEPTION_TYPE_AND_STACK_TRACE)
    single = retries.retry_message(engine, attempts[0].unique_message_id)
    grouped = retries.retry_group(engine, group.id)

    async def scenario() -> dict:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            processor = make_processor(settings, engine, transport, body_store)
            assert await processor.process_pending() == 2
            await processor.close()
            app = create_app(settings, engine, body_store)
            api = httpx.AsyncClient(
                transport=httpx.ASGITransport(app),
                base_url="http://test",
                timeout=TEST_CLIENT_TIMEOUT,
            )
            async with api:
                operation = await api.get(f"/api/retries/{grouped.operation_id}")
                assert operation.json()["completion_time"] is not None
                return (await api.get("/api/recoverability/history")).json()

    history = asyncio.run(scenario())

    historic = {item["retry_type"]: item for item in history["historic_operations"]}
    assert historic.keys() == {"SingleMessage", "FailureGroup"}
    assert historic["SingleMessage"]["request_id"] == attempts[0].unique_message_id
    assert historic["FailureGroup"] | {"start_time": None, "completion_time": None} == {
        "request_id": group.id,
        "retry_type": "FailureGroup",
        "start_time": None,
        "completion_time": None,
        "originator": group.title,
        "failed": False,
        "number_of_messages_processed": 2,  # the third was already in the single retry
    }
    assert historic["FailureGroup"]["completion_time"].endswith("Z")
    (unacknowledged,) = history["unacknowledged_operations"]  # group retries need an ack
    assert unacknowledged["request_id"] == group.id
    assert unacknowledged["classifier"] == EXCEPTION_TYPE_AND_STACK_TRACE
    assert single.message_count == 1


def test_only_one_processor_holds_the_lease(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    store_many(settings, writer, 2, endpoint="Q")
    retries.retry_all(engine)

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            first = make_processor(settings, engine, transport, body_store, lease_seconds=60)
            second = make_processor(settings, engine, transport, body_store, lease_seconds=60)
            assert await asyncio.to_thread(first._lease.hold)
            assert await second.process_pending() == 0  # the first holds the lease
            assert batch_statuses(engine) == ["staging"]
            await first.close()  # released: the second takes over at once
            assert await second.process_pending() == 1
            await second.close()

    asyncio.run(scenario())
    assert batch_statuses(engine) == ["done"]


def three_retried_in_one_batch(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter
) -> str:
    """Three failed messages of queue ``Q``, all retried: the one batch's id."""
    store_many(settings, writer, 3, endpoint="Q")
    retries.retry_all(engine)
    (batch_id,) = batch_ids(engine)
    return batch_id


def test_a_window_in_flight_when_its_lease_is_lost_is_sent_once(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    # docs/decisions.md "A window in flight is claimed": a process that loses its lease
    # mid-window (its session ended, or it paused past the lease) still sends that window;
    # the process that takes over must not send it too.
    batch_id = three_retried_in_one_batch(settings, engine, writer)

    async def scenario() -> list[str]:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            first = make_processor(settings, engine, transport, body_store, lease_seconds=60)
            second = make_processor(settings, engine, transport, body_store, lease_seconds=60)
            assert await asyncio.to_thread(first._lease.hold)
            await asyncio.to_thread(first._stage, batch_id)
            window = await asyncio.to_thread(first._take_window, batch_id)
            await first.close()  # the lease is lost while its window is in flight
            assert await second.process_pending() == 1  # the second takes over
            assert batch_statuses(engine) == ["forwarding"]  # the window is not its own
            sent = await first._send_window(window)  # the first's sends complete
            await asyncio.to_thread(first._record_window, batch_id, sent)
            assert await second.process_pending() == 1
            await second.close()
            async with Collector(transport, "Q", prefetch=10) as collector:
                delivered = await take(collector, 3)
                with contextlib.suppress(TimeoutError):  # nothing more comes
                    delivered.append(await collector.get(timeout=1.0))
            return [d.headers["ServiceControl.Retry.UniqueMessageId"] or "" for d in delivered]

    delivered = asyncio.run(scenario())
    assert sorted(delivered) == sorted(statuses(engine)), delivered  # each once
    assert batch_statuses(engine) == ["done"]
    with engine.connect() as conn:
        assert conn.execute(sa.select(retry_operations.c.forwarded_count)).scalar_one() == 3


def assert_all_three_sent(engine: sa.Engine) -> None:
    """The one batch done, its operation counting its three messages sent, none failed."""
    assert batch_statuses(engine) == ["done"]
    with engine.connect() as conn:
        operation = conn.execute(sa.select(retry_operations)).one()
    assert (operation.forwarded_count, operation.skipped_count, operation.failed) == (3, 0, False)


def test_a_window_confirmed_before_it_is_written_counts_as_sent(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    """Fresh user, session 33: an endpoint that handled a retried message at once had its
    confirmation ingested, and the claim removed, before the processor wrote the window
    that sent it; the operation said "19982 sent, 18 could not be sent" where all 20,000
    went out and came back confirmed."""
    batch_id = three_retried_in_one_batch(settings, engine, writer)

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            processor = make_processor(settings, engine, transport, body_store)
            assert await asyncio.to_thread(processor._lease.hold)
            await asyncio.to_thread(processor._stage, batch_id)
            window = await asyncio.to_thread(processor._take_window, batch_id)
            sent = await processor._send_window(window)
            # The endpoint's confirmations are stored before the window is written.
            writer.write(IngestionBatch(confirmed_retries=sorted(statuses(engine))))
            await asyncio.to_thread(processor._record_window, batch_id, sent)
            assert await processor.process_pending() == 1
            await processor.close()

    asyncio.run(scenario())
    assert_all_three_sent(engine)
    assert set(statuses(engine).values()) == {FailedMessageStatus.RESOLVED}


def test_a_window_sent_by_a_process_that_died_before_writing_it_counts_as_sent(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    """Breaker, session 33: serve killed mid-forwarding; the window it had sent was
    confirmed, its claims removed, and the operation ended "19076 sent, 13 could not be
    sent" of 19,089 all sent and confirmed. A claim a confirmation removes after a window
    took it, before its send was written, counts as sent."""
    batch_id = three_retried_in_one_batch(settings, engine, writer)

    def later(seconds: float) -> Callable[[], datetime]:
        return lambda: datetime.now(UTC) + timedelta(seconds=seconds)

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            dead = make_processor(settings, engine, transport, body_store)
            assert await asyncio.to_thread(dead._lease.hold)
            await asyncio.to_thread(dead._stage, batch_id)
            window = await asyncio.to_thread(dead._take_window, batch_id)
            await dead._send_window(window)  # sent; the process dies before writing it
            await dead.close()
            writer.write(IngestionBatch(confirmed_retries=sorted(statuses(engine))))
            late = make_processor(settings, engine, transport, body_store, clock=later(61))
            await late.process_pending()
            await late.close()

    asyncio.run(scenario())
    assert_all_three_sent(engine)


def test_a_window_whose_process_died_is_sent_once_its_mark_is_past(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    # At least once, never lost: the window a dead process took goes out after its mark.
    batch_id = three_retried_in_one_batch(settings, engine, writer)

    def later(seconds: float) -> Callable[[], datetime]:
        return lambda: datetime.now(UTC) + timedelta(seconds=seconds)

    async def scenario() -> int:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            dead = make_processor(settings, engine, transport, body_store, in_flight_seconds=60)
            assert await asyncio.to_thread(dead._lease.hold)
            await asyncio.to_thread(dead._stage, batch_id)
            assert len(await asyncio.to_thread(dead._take_window, batch_id)) == 3
            await dead.close()  # and never sends
            early = make_processor(settings, engine, transport, body_store, clock=later(59))
            await early.process_pending()
            await early.close()
            assert batch_statuses(engine) == ["forwarding"]  # still the dead one's window
            late = make_processor(settings, engine, transport, body_store, clock=later(61))
            await late.process_pending()
            await late.close()
            async with Collector(transport, "Q", prefetch=10) as collector:
                return len(await take(collector, 3))

    assert asyncio.run(scenario()) == 3
    assert batch_statuses(engine) == ["done"]


def test_a_lease_ends_with_a_holder_that_died(engine: sa.Engine) -> None:
    """SQLite: the lease row expires when its holder stops renewing. PostgreSQL: the
    advisory lock ends with the holder's session."""
    dead = provider_for(engine).make_lease(engine, "test-lease", str(uuid.uuid4()), 0.3)
    alive = provider_for(engine).make_lease(engine, "test-lease", str(uuid.uuid4()), 0.3)
    assert dead.hold() and dead.hold()  # renewing is holding
    assert not alive.hold()
    if engine.dialect.name == "postgresql":
        holder: sa.Connection = dead._conn  # type: ignore[attr-defined]
        pid = holder.execute(sa.select(sa.func.pg_backend_pid())).scalar_one()
        with engine.connect() as conn:
            # pg_terminate_backend only signals: wait (bounded) until the session is gone.
            conn.execute(sa.select(sa.func.pg_terminate_backend(pid, 5000)))
    else:
        asyncio.run(asyncio.sleep(0.4))  # no renewal within the lease
    assert alive.hold()
    assert not dead.hold()  # the dead holder learns it lost the lease
    alive.release()
    dead.release()


def test_an_operation_whose_request_died_midway_is_closed_with_the_batches_it_has(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    store_many(settings, writer, 2, endpoint="Q")
    request = retries.retry_all(engine)
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    with engine.begin() as conn:  # as if the request died before it finished preparing
        conn.execute(sa.update(retry_operations).values(prepared_at=None, last_modified=long_ago))

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            processor = make_processor(settings, engine, transport, body_store)
            assert await processor.process_pending() == 1
            await processor.close()

    asyncio.run(scenario())

    with engine.connect() as conn:
        operation = retries.get_operation(conn, request.operation_id)
    assert operation is not None
    assert operation.prepared_at is not None and operation.completed_at is not None
    assert operation.forwarded_count == 2
    with engine.connect() as conn:
        requested = conn.execute(
            sa.select(event_log_items.c.description).where(
                event_log_items.c.event_type == "RetryOperationRequested"
            )
        ).scalars()
        # One by the request, which this test then made look unfinished; one by the close.
        said = [
            text.endswith("its request ended before it claimed every message") for text in requested
        ]
    assert sorted(said) == [False, True]


@contextlib.contextmanager
def batch_row_held(engine: sa.Engine, batch_id: str) -> Iterator[None]:
    """Hold the batch's row (PostgreSQL: locked for update; SQLite: the one write
    transaction) until the block ends."""
    if engine.dialect.name == "sqlite":
        with begin_write(engine):
            yield
        return
    with engine.begin() as conn:
        conn.execute(
            sa.select(retry_batches.c.id).where(retry_batches.c.id == batch_id).with_for_update()
        )
        yield


def test_a_batch_staged_by_two_processes_at_once_is_staged_once(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    # Two processes may stage one batch while the lease changes hands; its dropped claims
    # must count once. Both stagings are made to wait on the batch's row, then let go.
    batch_id = three_retried_in_one_batch(settings, engine, writer)
    set_status(engine, sorted(statuses(engine))[0], FailedMessageStatus.ARCHIVED)
    processors = [
        make_processor(settings, engine, EmbeddedQueue(settings.embedded_queue_path), body_store)
        for _ in range(2)
    ]
    with ThreadPoolExecutor(2) as pool:
        with batch_row_held(engine, batch_id):
            stagings = [pool.submit(p._stage, batch_id) for p in processors]
            time.sleep(1.0)  # both reach the batch's row and wait on it
        for staging in stagings:
            staging.result(timeout=TIMEOUT)

    with engine.connect() as conn:
        skipped = conn.execute(sa.select(retry_operations.c.skipped_count)).scalar_one()
    assert skipped == 1
    assert batch_statuses(engine) == ["forwarding"]
