"""``controlroom demo endpoints`` closes the demo's loop (docs/decisions.md "The demo closes
the retry loop"). Given the demo's
failed messages retried, the demo endpoints confirm most (the rows become Resolved through
the ingestion of the confirmations) and fail some again (Unresolved, one more attempt),
the same ones for the same seed. Every provider, on the embedded queue and RabbitMQ."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.demo import (
    demo_endpoint_queues,
    failed_again_headers,
    generate_demo_messages,
)
from controlroom.demo_endpoints import (
    DEFAULT_FAIL_RATIO,
    DemoEndpoints,
    Handled,
    Outcome,
    fails_again,
)
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.retries import requests as retries
from controlroom.errors.retries import wire as retry_wire
from controlroom.exceptions import MessageRejected
from controlroom.transport import create_transport
from tests import servers
from tests.retries.conftest import TIMEOUT, make_processor, statuses, store_failed, wait_for

SEED = 5
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def attempts(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(failed_messages.c.id, failed_messages.c.number_of_processing_attempts)
        )
        return {row.id: row.number_of_processing_attempts for row in rows}


@pytest.fixture(params=["embedded", "rabbitmq"])
def transport_settings(request: pytest.FixtureRequest, settings: Settings) -> Iterator[Settings]:
    """The settings on the embedded queue, or on a RabbitMQ vhost of this test's own (the
    demo endpoints consume fixed queue names: Sales, Billing, ...)."""
    if request.param == "embedded":
        yield settings
        return
    url, vhost = servers.create_rabbitmq_vhost()
    try:
        yield settings.model_copy(update={"broker_url": url})
    finally:
        servers.delete_rabbitmq_vhost(vhost)


def test_demo_endpoints_confirm_most_retries_and_fail_some_again(
    transport_settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    settings = transport_settings
    for message in generate_demo_messages(30, seed=SEED, now=NOW):
        with contextlib.suppress(MessageRejected):  # the one broken message
            store_failed(settings, writer, body_store, message.headers, message.body)
    before = attempts(engine)
    ids = sorted(before)
    request = retries.retry_all(engine)
    assert request.message_count == len(ids)
    handled: list[Handled] = []

    async def scenario() -> None:
        transport = create_transport(settings)
        await transport.start()
        try:
            processor = make_processor(settings, engine, transport, body_store)
            assert await processor.process_pending() >= 1
            await processor.close()
            ingestion = IngestionService(settings, engine, transport, body_store)
            endpoints = DemoEndpoints(
                transport, error_queue=settings.error_queue, seed=SEED, on_handled=handled.append
            )
            tasks = [asyncio.create_task(ingestion.run()), asyncio.create_task(endpoints.run())]
            try:
                await wait_for(
                    lambda: FailedMessageStatus.RETRY_ISSUED not in statuses(engine).values()
                )
                for task in tasks:
                    assert not task.done(), task.exception()
            finally:
                await ingestion.stop()
                tasks[1].cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await transport.close()

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT * 2))

    chosen = {i for i in ids if fails_again(SEED, i, 1, DEFAULT_FAIL_RATIO)}
    assert 0 < len(chosen) < len(ids) / 2  # most are confirmed, some fail again
    now, after = statuses(engine), attempts(engine)
    assert {i for i in ids if now[i] is FailedMessageStatus.UNRESOLVED} == chosen
    assert {i for i in ids if now[i] is FailedMessageStatus.RESOLVED} == set(ids) - chosen
    assert {i: after[i] for i in chosen} == {i: before[i] + 1 for i in chosen}
    assert sorted(item.unique_message_id or "" for item in handled) == ids
    assert {item.unique_message_id for item in handled if item.outcome is Outcome.FAILED_AGAIN} == (
        chosen
    )


# --- the pure parts -----------------------------------------------------------------------
def test_which_messages_fail_again_depends_on_the_seed_message_and_delivery_only() -> None:
    keys = [f"00000000-0000-0000-0000-{n:012d}" for n in range(200)]

    first = [fails_again(1, key, 1, 0.25) for key in keys]

    assert first == [fails_again(1, key, 1, 0.25) for key in keys]  # the same seed: the same
    assert first != [fails_again(2, key, 1, 0.25) for key in keys]  # another seed: others
    assert first != [fails_again(1, key, 2, 0.25) for key in keys]  # a retry again: a new draw
    assert 25 < sum(first) < 75  # about a quarter
    assert not any(fails_again(1, key, 1, 0.0) for key in keys)
    assert all(fails_again(1, key, 1, 1.0) for key in keys)


def retried_headers(queue: str) -> dict[str, str | None]:
    """The headers a demo message failed in ``queue`` arrives with when retried."""
    message = next(
        m
        for m in generate_demo_messages(30, seed=SEED, now=NOW)
        if (m.headers.get(h.FAILED_Q) or "").partition("@")[0] == queue
    )
    unique_id = parse_failed_message(
        message.headers, message.body, max_body_size_to_store=102_400
    ).unique_message_id
    return retry_wire.retry_headers(
        message.headers,
        unique_message_id=unique_id,
        acknowledgement_queue="error",
        target_endpoint_address=None,
    )


@pytest.mark.parametrize("queue", demo_endpoint_queues())
def test_a_message_failing_again_is_a_new_attempt_of_the_same_failed_message(queue: str) -> None:
    received = retried_headers(queue)
    later = datetime(2026, 12, 2, 8, 30, tzinfo=UTC)

    headers = failed_again_headers(queue, received, now=later)

    attempt = parse_failed_message(headers, b"{}", max_body_size_to_store=102_400)
    assert attempt.unique_message_id == received[retry_wire.RETRY_UNIQUE_MESSAGE_ID]
    assert attempt.time_of_failure == later
    assert attempt.queue_address.partition("@")[0] == queue
    assert attempt.receiving_endpoint == queue
    assert headers[h.EXCEPTION_TYPE] and headers[h.EXCEPTION_STACK_TRACE]
    unchanged = {name for name in received if not name.startswith(("$.", "NServiceBus.Proc"))}
    assert {name: headers[name] for name in unchanged} == {n: received[n] for n in unchanged}


def test_failing_again_refuses_a_queue_no_demo_endpoint_reads() -> None:
    with pytest.raises(ValueError, match="'Accounting'"):
        failed_again_headers("Accounting", {}, now=NOW)
