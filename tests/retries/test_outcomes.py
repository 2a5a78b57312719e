"""A retry's outcome, every provider (docs/decisions.md "A retry's outcome counts the
failures since"): the messages a retry operation claimed that have failed again since it
started are counted wherever they are now (another group, queue or endpoint), in the
event log, on the groups page and for a selection of ids; a message the operation did not
claim is not; the retention sweep takes an operation's claimed ids with it."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import httpx
import pytest
import sqlalchemy as sa

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db import tables
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.grouping import EXCEPTION_TYPE_AND_STACK_TRACE
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.retention import sweep_expired_failed_messages
from controlroom.errors.retries import outcomes
from controlroom.errors.retries import requests as retries
from controlroom.runtime.clock import utc_now
from controlroom.transport.embedded import EmbeddedQueue
from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import make_processor, store_failed
from tests.servers import TEST_CLIENT_TIMEOUT

OTHER_EXCEPTION = "System.TimeoutException"


def send_every_retry(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    """Run a processor until every pending batch is sent (the operations complete)."""

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            processor = make_processor(settings, engine, transport, body_store)
            await processor.process_pending()
            await processor.close()

    asyncio.run(scenario())


def read(settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, path: str) -> str:
    """``path`` of the API or the console, as text."""

    async def scenario() -> str:
        app = create_app(settings, engine, body_store)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app),
            base_url="http://127.0.0.1",
            timeout=TEST_CLIENT_TIMEOUT,
        ) as api:
            answer = await api.get(path)
            assert answer.status_code == 200, answer.text
            return answer.text

    return asyncio.run(scenario())


def failed_again_since(engine: sa.Engine, operation_id: str) -> int | None:
    with engine.connect() as conn:
        operation = retries.get_operation(conn, operation_id)
        assert operation is not None
        return outcomes.failed_again_since(conn, operation)


def test_a_group_retry_counts_the_messages_it_sent_that_failed_again_in_another_group(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    attempts = [
        store_failed(settings, writer, body_store, failed_headers(f"order-{n}", failed_at=at(0)))
        for n in range(5)
    ]
    (group,) = (g for g in attempts[0].groups if g.classifier == EXCEPTION_TYPE_AND_STACK_TRACE)
    operation_id = retries.retry_group(engine, group.id).operation_id
    send_every_retry(settings, engine, body_store)

    # Three fail again at their endpoint with another exception: another group now.
    for n in (0, 2, 4):
        again = failed_headers(f"order-{n}", failed_at=at(3600), exception_type=OTHER_EXCEPTION)
        regrouped = store_failed(settings, writer, body_store, again)
        assert group.id not in {g.id for g in regrouped.groups}

    assert failed_again_since(engine, operation_id) == 3
    events = read(settings, engine, body_store, "/api/eventlogitems")
    assert "finished: 5 sent; 3 failed again since and are unresolved" in events
    page = read(
        settings, engine, body_store, f"/groups?classifier={EXCEPTION_TYPE_AND_STACK_TRACE}"
    )
    assert "Last retry: 5 sent; 3 failed again since and are unresolved" in page


def test_queue_and_endpoint_retries_count_messages_that_failed_again_elsewhere(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    sales = store_failed(settings, writer, body_store, failed_headers("q-1", endpoint="Sales"))
    by_queue = retries.retry_queue(engine, "Sales").operation_id
    billing = store_failed(settings, writer, body_store, failed_headers("e-1", endpoint="Billing"))
    by_endpoint = retries.retry_endpoint(engine, "Billing").operation_id
    send_every_retry(settings, engine, body_store)

    # Both fail again in another queue, at another endpoint (a retry's headers keep the
    # message's id: it is the same failed message).
    for message, attempt in (("q-1", sales), ("e-1", billing)):
        again = failed_headers(message, endpoint="Shipping", failed_at=at(3600))
        again["ServiceControl.Retry.UniqueMessageId"] = attempt.unique_message_id
        assert store_failed(settings, writer, body_store, again).queue_address == "Shipping"

    assert failed_again_since(engine, by_queue) == 1
    assert failed_again_since(engine, by_endpoint) == 1


def test_a_retry_of_selected_ids_counts_its_failures_since_and_only_what_it_claimed(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    ids = [
        store_failed(settings, writer, body_store, failed_headers(f"s-{n}")).unique_message_id
        for n in range(4)
    ]
    single = retries.retry_message(engine, ids[0]).operation_id
    # The first is in the single retry already: the selection claims the other three.
    selection = retries.retry_messages(engine, ids)
    assert selection.skipped_count == 1
    send_every_retry(settings, engine, body_store)

    for message in ("s-0", "s-1"):
        again = failed_headers(message, failed_at=at(3600), exception_type=OTHER_EXCEPTION)
        store_failed(settings, writer, body_store, again)

    assert failed_again_since(engine, selection.operation_id) == 1  # s-1, not s-0
    assert failed_again_since(engine, single) == 1
    events = read(settings, engine, body_store, "/api/eventlogitems")
    assert events.count("finished: 1 sent; 1 failed again since and is unresolved") == 1
    assert "finished: 3 sent; 1 failed again since and is unresolved" in events


def test_the_retention_sweep_takes_a_purged_operations_claimed_ids(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    kept = store_failed(settings, writer, body_store, failed_headers("k-1")).unique_message_id
    gone = store_failed(settings, writer, body_store, failed_headers("g-1")).unique_message_id
    old = retries.retry_message(engine, gone).operation_id
    send_every_retry(settings, engine, body_store)
    running = retries.retry_message(engine, kept).operation_id  # not sent: not completed

    def claimed() -> set[tuple[str, str]]:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(tables.retry_operation_messages)).all()
        return {(row.operation_id, row.failed_message_id) for row in rows}

    assert claimed() == {(old, gone), (running, kept)}
    sweep_expired_failed_messages(
        engine, body_store, retention_period=timedelta(hours=1), now=utc_now() + timedelta(days=1)
    )
    assert claimed() == {(running, kept)}


def test_the_log_names_the_operation_a_staged_batch_belongs_to(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """serve's log line of a staged batch carries the operation's id, the one the event
    log's "retry operation ... finished" names, so an operator can match the two."""
    store_failed(settings, writer, body_store, failed_headers("log-1"))
    operation_id = retries.retry_queue(engine, "Sales").operation_id
    caplog.set_level(logging.INFO, logger="controlroom.errors.retries.processor")
    send_every_retry(settings, engine, body_store)
    staged = [r.getMessage() for r in caplog.records if "staged" in r.getMessage()]
    assert len(staged) == 1 and f"of retry operation {operation_id}" in staged[0], staged
