"""Retries of a Python task's failed message on every provider and both transports: the
task message goes back as its producer sent it (body bytes, broker properties, typed
header table) plus the retry headers; an edited copy keeps the properties; properties
that do not parse fail that message alone (docs/design.md "Python task queues")."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, retry_operations
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.retries import requests as retries
from controlroom.errors.retries import wire as retry_wire
from controlroom.integrations import envelope
from controlroom.transport.base import Delivery, Transport
from controlroom.transport.embedded import EmbeddedQueue
from controlroom.transport.rabbitmq import RabbitMQTransport
from tests.retries.conftest import (
    TIMEOUT,
    make_processor,
    statuses,
    store_failed,
    take,
    unique_name,
)
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.transport.helpers import Collector

PICKLE_BODY = (
    b"\x80\x05\x95#\x00\x00\x00\x00\x00\x00\x00(K\x01]\x94(K\x02N\x85\x94}\x94}\x94t\x94.\xff\x00"
)

CELERY_TABLE: dict[str, Any] = {
    "lang": "py",
    "task": "shop.tasks.charge",
    "id": "",  # set per message
    "shadow": None,
    "eta": None,
    "retries": 3,
    "timelimit": [None, 30],
    "argsrepr": "(1, [2, None])",
    "ignore_result": False,
    "stamps": {},
    "blob": b"\x00\xff",
}


@pytest.fixture(params=["embedded", "rabbitmq"])
def make_transport(request: pytest.FixtureRequest, settings: Settings) -> Callable[[], Transport]:
    """A transport of each kind (the test runs once per transport and provider)."""
    if request.param == "embedded":
        return lambda: EmbeddedQueue(settings.embedded_queue_path)
    url = request.getfixturevalue("rabbitmq_url")
    return lambda: RabbitMQTransport(url)


def task_failure_headers(
    queue: str, *, table: dict[str, Any] | None = None, **changes: Any
) -> tuple[str, dict[str, str | None], dict[str, Any]]:
    """(task id, the failed message's headers, the consumed message's properties) of a
    Celery task that failed in ``queue``."""
    task_id = str(uuid.uuid4())
    properties: dict[str, Any] = {
        "content_type": "application/x-python-serialize",
        "content_encoding": "binary",
        "correlation_id": task_id,
        "reply_to": "b3c1d2e4-reply",
        "priority": 4,
        "headers": (table or CELERY_TABLE) | {"id": task_id},
    }
    try:
        raise ValueError("card declined")
    except ValueError as exc:
        failure = envelope.capture_failure(exc)
    headers = envelope.failed_message_headers(
        kind=envelope.CELERY,
        task_id=task_id,
        task_name="shop.tasks.charge",
        queue=queue,
        endpoint="shop",
        host="worker-1",
        failure=failure,
        time_of_failure=datetime.now(UTC),
        retries=3,
        content_type=properties["content_type"],
        properties=properties,
    )
    headers.update(changes)
    return task_id, headers, properties


def retry_and_receive(
    settings: Settings,
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
    make_transport: Callable[[], Transport],
    queue: str,
    count: int,
) -> list[Delivery]:
    """Retry every stored message, run one processor pass, take ``count`` from ``queue``."""
    retries.retry_all(engine)

    async def scenario() -> list[Delivery]:
        async with make_transport() as transport:  # type: ignore[attr-defined]
            processor = make_processor(settings, engine, transport, body_store)
            async with asyncio.timeout(TIMEOUT):
                try:
                    await processor.process_pending()
                finally:
                    await processor.close()
                async with Collector(transport, queue, prefetch=5) as collector:
                    deliveries = await take(collector, count)
                    await collector.assert_idle(0.3)
            return deliveries

    return asyncio.run(scenario())


def test_a_retried_task_message_goes_back_as_its_producer_sent_it(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    make_transport: Callable[[], Transport],
) -> None:
    queue = unique_name("celery")
    # A table that went through an earlier retry: its retry headers are replaced.
    stale = CELERY_TABLE | {
        retry_wire.RETRY_UNIQUE_MESSAGE_ID: str(uuid.uuid4()),
        retry_wire.TARGET_ENDPOINT_ADDRESS: "elsewhere",
    }
    task_id, headers, properties = task_failure_headers(queue, table=stale)
    attempt = store_failed(settings, writer, body_store, headers, PICKLE_BODY)

    (delivery,) = retry_and_receive(settings, engine, body_store, make_transport, queue, 1)

    assert delivery.body == PICKLE_BODY
    sent = delivery.properties
    assert sent is not None
    assert (sent.content_encoding, sent.correlation_id, sent.reply_to, sent.priority) == (
        "binary",
        task_id,
        "b3c1d2e4-reply",
        4,
    )
    expected = {
        name: value
        for name, value in properties["headers"].items()
        if name != retry_wire.TARGET_ENDPOINT_ADDRESS
    } | {
        retry_wire.RETRY_UNIQUE_MESSAGE_ID: attempt.unique_message_id,
        retry_wire.RETRY_ACKNOWLEDGEMENT_QUEUE: settings.error_queue,
    }
    assert dict(sent.headers or {}) == expected  # typed: ints, lists, nulls, bytes as sent
    assert delivery.headers["NServiceBus.MessageId"] == task_id  # the message-id property
    assert statuses(engine)[attempt.unique_message_id] == FailedMessageStatus.RETRY_ISSUED


def test_properties_that_do_not_parse_fail_that_message_and_the_others_go(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    make_transport: Callable[[], Transport],
) -> None:
    queue = unique_name("celery")
    _, good_headers, _ = task_failure_headers(queue)
    _, bad_headers, _ = task_failure_headers(
        queue, **{retry_wire.TASK_PROPERTIES: '{"headers": [1, 2]}'}
    )
    good = store_failed(settings, writer, body_store, good_headers, b"[[1], {}, {}]")
    bad = store_failed(settings, writer, body_store, bad_headers, b"[[2], {}, {}]")

    (delivery,) = retry_and_receive(settings, engine, body_store, make_transport, queue, 1)

    assert delivery.body == b"[[1], {}, {}]"
    now = statuses(engine)
    assert now[good.unique_message_id] == FailedMessageStatus.RETRY_ISSUED
    assert now[bad.unique_message_id] == FailedMessageStatus.UNRESOLVED
    with engine.connect() as conn:
        operation = conn.execute(sa.select(retry_operations)).one()
    assert operation.failed
    assert (operation.forwarded_count, operation.skipped_count) == (1, 1)


def test_outgoing_message_names_the_header_that_does_not_parse() -> None:
    headers: dict[str, str | None] = {retry_wire.TASK_PROPERTIES: "{not json"}
    with pytest.raises(retry_wire.UnsendableMessage, match=r"Controlroom\.TaskQueue\.Properties"):
        retry_wire.outgoing_message(headers)
    headers = {retry_wire.TASK_PROPERTIES: json.dumps({"priority": 300})}
    with pytest.raises(retry_wire.UnsendableMessage, match="priority"):
        retry_wire.outgoing_message(headers)


def test_an_edited_task_message_keeps_its_properties_with_the_body_edited(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    make_transport: Callable[[], Transport],
) -> None:
    queue = unique_name("celery")
    task_id, headers, properties = task_failure_headers(queue)
    original = store_failed(settings, writer, body_store, headers, b"[[-1], {}, {}]")
    edited = {name: value for name, value in headers.items() if value is not None}

    async def scenario() -> tuple[httpx.Response, httpx.Response, Delivery]:
        async with make_transport() as transport:  # type: ignore[attr-defined]
            app = create_app(settings, engine, body_store, transport=transport)
            api = httpx.AsyncClient(
                transport=httpx.ASGITransport(app),
                base_url="http://test",
                timeout=TEST_CLIENT_TIMEOUT,
            )
            async with api, asyncio.timeout(TIMEOUT):
                refused = await api.post(
                    f"/api/edit/{original.unique_message_id}",
                    json={
                        "message_body": "[[1], {}, {}]",
                        "message_headers": edited | {retry_wire.TASK_PROPERTIES: "[]"},
                    },
                )
                response = await api.post(
                    f"/api/edit/{original.unique_message_id}",
                    json={"message_body": "[[1], {}, {}]", "message_headers": edited},
                )
                async with Collector(transport, queue, prefetch=5) as collector:
                    (delivery,) = await take(collector, 1)
                    await collector.assert_idle(0.3)
            return refused, response, delivery

    refused, response, delivery = asyncio.run(scenario())

    assert refused.status_code == 400
    assert "Controlroom.TaskQueue.Properties" in refused.text
    assert response.status_code == 202, response.text
    answer = response.json()
    assert delivery.body == b"[[1], {}, {}]"
    sent = delivery.properties
    assert sent is not None
    assert (sent.content_encoding, sent.correlation_id, sent.priority) == ("binary", task_id, 4)
    assert dict(sent.headers or {}) == properties["headers"] | {
        retry_wire.RETRY_UNIQUE_MESSAGE_ID: answer["edit_id"],
        retry_wire.RETRY_ACKNOWLEDGEMENT_QUEUE: settings.error_queue,
        retry_wire.EDIT_OF: original.unique_message_id,
    }
    assert statuses(engine)[original.unique_message_id] == FailedMessageStatus.RESOLVED
